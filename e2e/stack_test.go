package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"

	launcher "github.com/integrations-platform/integrations/e2e/stack"
	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/freeport"
	"github.com/integrations-platform/integrations/pkg/tlsx/devca"
)

// root is the workspace's root, binDir holds the programs every stack runs (launcher.Build).
var root, binDir string

// tlsDir holds the run's throwaway CA and the services' certificates (devca): every stack runs
// with mTLS on every internal hop.
var tlsDir string

// publicTLSEnv, set to true, runs every stack with TLS on the client-facing listeners too (the
// gateway's REST and gRPC ports, adapter-callback's): INTEGRATIONS_E2E_PUBLIC_TLS=true go test ./e2e/
const publicTLSEnv = "INTEGRATIONS_E2E_PUBLIC_TLS"

// adminToken authenticates the stacks' operator endpoints.
const adminToken = "e2e-admin-token"

// timeScale shrinks every delay of the stacks: a minute becomes 60 ms.
const timeScale = 0.001

// startTimeout bounds a program's start-up, and the tests' waits for what a started stack does
// at once.
const startTimeout = 20 * time.Second

func TestMain(m *testing.M) {
	var err error
	if root, err = launcher.FindRoot(); err == nil {
		binDir, err = launcher.Build(context.Background(), root, os.Stderr)
	}
	if err == nil {
		tlsDir = filepath.Join(binDir, "tls")
		_, err = devca.Ensure(tlsDir)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// The leak check runs after the tests, before this cleanup: every stack's processes have been
	// waited for by then (t.Cleanup), so their exec.Cmd goroutines are gone too.
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		fmt.Fprintln(os.Stderr, contractSummary())
		_ = os.RemoveAll(binDir)
		os.Exit(code)
	}))
}

// stack is one platform (launcher.Stack) for a test: the test's schema (dbtest), and failures
// that end the test instead of errors.
type stack struct {
	*launcher.Stack
	t      *testing.T
	schema *dbtest.Schema
	// http is the client for RESTURL: TLS when the stack serves it, every call held to the
	// OpenAPI document (contractClient).
	http *http.Client
}

// newStack prepares a stack and applies its catalog; start launches processes.
func newStack(t *testing.T) *stack { return newStackScaled(t, timeScale) }

// newStackTLS prepares a stack whose client-facing listeners serve TLS, whatever publicTLSEnv says.
func newStackTLS(t *testing.T) *stack { return newStackWith(t, timeScale, true) }

// newStackScaled prepares a stack whose delays are multiplied by scale.
func newStackScaled(t *testing.T, scale float64) *stack {
	return newStackWith(t, scale, os.Getenv(publicTLSEnv) == "true")
}

func newStackWith(t *testing.T, scale float64, publicTLS bool) *stack {
	t.Helper()
	return newStackOn(t, launcher.Broker{}, scale, publicTLS)
}

// newStackOn prepares a stack whose services use broker b (RabbitMQ when zero).
func newStackOn(t *testing.T, b launcher.Broker, scale float64, publicTLS bool) *stack {
	t.Helper()
	schema := dbtest.NewSchema(t)
	st, err := launcher.New(t.Context(), launcher.Config{
		Root: root, BinDir: binDir, TLSDir: tlsDir, DatabaseURL: dbtest.BaseURL(), Schema: schema.Name,
		Broker: b, Name: "e2e", LogLevel: "debug", TimeScale: scale, PublicTLS: publicTLS, StartTimeout: startTimeout,
		Env: []string{
			"INTEGRATIONS_MAX_PAYLOAD_BYTES=65536",
			"INTEGRATIONS_ADMIN_TOKEN=" + adminToken,
			// Sweep expired leases promptly: the real-time grace for in-flight outcomes is kept
			// short here, where everything is local.
			"INTEGRATIONS_SWEEP_INTERVAL=100ms",
			"INTEGRATIONS_SWEEP_GRACE=100ms",
			// Nothing routes by health here: a short drain window keeps stops and restarts quick.
			"INTEGRATIONS_DRAIN_WINDOW=50ms",
		},
	})
	require.NoError(t, err)
	s := &stack{Stack: st, t: t, schema: schema, http: http.DefaultClient}
	// Runs before dbtest's cleanups (registered earlier): the processes are gone before the
	// schema is emptied for the next test.
	t.Cleanup(func() {
		if t.Failed() {
			s.StopAll()
			t.Logf("--- logs (tails) ---\n%s", s.LogTails())
		}
		if err := s.Close(); err != nil {
			t.Log(err)
		}
	})
	if publicTLS {
		s.http = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: caPool(t), MinVersion: tls.VersionTLS12}}}
	}
	s.http = contractClient(t, s.http)
	return s
}

// start launches the named programs and waits until each reports SERVING.
func (s *stack) start(names ...string) {
	s.t.Helper()
	require.NoError(s.t, s.Launch(s.t.Context(), names...))
}

// startInstance launches another instance of a program under its own name and addresses (a
// second replica), and waits until it is SERVING.
func (s *stack) startInstance(instance, program string) {
	s.t.Helper()
	require.NoError(s.t, s.AddInstance(instance, program))
	s.start(instance)
}

// stop sends SIGTERM and waits for a graceful exit.
func (s *stack) stop(name string) {
	s.t.Helper()
	_, err := s.Terminate(name, 20*time.Second)
	require.NoError(s.t, err)
}

// kill ends a program with SIGKILL: no graceful shutdown, as in a crash.
func (s *stack) kill(name string) {
	s.t.Helper()
	require.NoError(s.t, s.Kill(name))
}

// dialAs connects to an instance (launcher.Stack.Dial) as the service as ("" for no client
// certificate); the test closes it.
func (s *stack) dialAs(name, as string) *grpc.ClientConn {
	s.t.Helper()
	conn, err := s.Dial(name, as)
	require.NoError(s.t, err)
	s.t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// call makes a REST call with the stack's API key (unless key is given) and decodes the JSON
// answer into a map.
func (s *stack) call(method, path, key string, body []byte, headers ...string) (int, map[string]any) {
	s.t.Helper()
	req, err := http.NewRequest(method, s.RESTURL+path, bytes.NewReader(body))
	require.NoError(s.t, err)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := s.http.Do(req)
	require.NoError(s.t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(s.t, err)
	out := map[string]any{}
	if len(raw) > 0 {
		require.NoError(s.t, json.Unmarshal(raw, &out), "answer is not JSON: %s", raw)
	}
	return resp.StatusCode, out
}

func caPool(t *testing.T) *x509.CertPool {
	t.Helper()
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(mustRead(t, devca.CAFile(tlsDir))))
	return pool
}

// freeAddr returns a loopback address for a program a test starts (see pkg/freeport).
func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := freeport.Addr()
	require.NoError(t, err)
	return addr
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
