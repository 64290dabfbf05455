package e2e

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/integrations-platform/integrations/pkg/freeport"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health/grpc_health_v1"

	"github.com/integrations-platform/integrations/pkg/catalog"
	"github.com/integrations-platform/integrations/pkg/db/dbtest"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/mq"
	"github.com/integrations-platform/integrations/pkg/routes"
	"github.com/integrations-platform/integrations/pkg/tlsx"
	"github.com/integrations-platform/integrations/pkg/tlsx/devca"
	"github.com/integrations-platform/integrations/sdk/go/platformtoken"
)

const modulePrefix = "github.com/integrations-platform/integrations/"

// binaries are the programs a stack runs, by name → package.
var binaries = map[string]string{
	"gateway":            modulePrefix + "services/gateway",
	"dispatcher":         modulePrefix + "services/dispatcher",
	"execution-consumer": modulePrefix + "services/execution-consumer",
	"adapter-callback":   modulePrefix + "services/adapter-callback",
	"settlement":         modulePrefix + "services/settlement",
	"event-router":       modulePrefix + "services/event-router",
	"dummy-adapter":      modulePrefix + "cmd/dummy-adapter",
}

var binDir string

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

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "integrations-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	tlsDir = filepath.Join(dir, "tls")
	if _, err := devca.Ensure(tlsDir); err != nil {
		fmt.Fprintln(os.Stderr, "dev CA:", err)
		os.Exit(1)
	}
	args := []string{"build", "-o", dir + "/"}
	for _, pkg := range binaries {
		args = append(args, pkg)
	}
	build := exec.Command("go", args...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build services:", err)
		os.Exit(1)
	}
	// The leak check runs after the tests, before this cleanup: every stack's processes have been
	// waited for by then (t.Cleanup), so their exec.Cmd goroutines are gone too.
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		fmt.Fprintln(os.Stderr, contractSummary())
		_ = os.RemoveAll(dir)
		os.Exit(code)
	}))
}

// stack is one running platform: its own schema, queue scope, ports and processes.
type stack struct {
	// scale is the stack's INTEGRATIONS_TIME_SCALE.
	scale float64
	// broker is the message broker the services use (INTEGRATIONS_BROKER), and the tests' port to it.
	broker broker
	// extraEnv holds per-program environment overrides, by instance name.
	extraEnv map[string][]string
	// adapterCredential is the dummy adapter's, for calling adapter-callback as it would.
	adapterCredential string
	t                 *testing.T
	env               []string
	addrs             map[string]string // name → gRPC (or listen) address
	restURL           string
	apiKey            string
	schema            *dbtest.Schema
	procs             map[string]*process
	logDir            string
	timeout           time.Duration
	mu                sync.Mutex

	// platformKey signs the platform's calls to the dummy adapter (gateway, execution-consumer).
	platformKey ed25519.PrivateKey
	// publicTLS: the client-facing listeners serve TLS (see newStackTLS); http is the client
	// for restURL either way.
	publicTLS bool
	http      *http.Client
	binaryOf  map[string]string // instance name → program, guarded by mu
}

type process struct {
	cmd  *exec.Cmd
	done chan struct{}
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
	return newStackOn(t, rabbitMQBroker(), scale, publicTLS)
}

// newStackOn prepares a stack whose services use broker b.
func newStackOn(t *testing.T, b broker, scale float64, publicTLS bool) *stack {
	t.Helper()
	schema := dbtest.NewSchema(t)
	s := &stack{
		t: t, broker: b, schema: schema, addrs: map[string]string{}, procs: map[string]*process{},
		logDir: t.TempDir(), apiKey: "dev_" + randomHex(16), timeout: 20 * time.Second,
		scale: scale, extraEnv: map[string][]string{}, binaryOf: map[string]string{},
		publicTLS: publicTLS, http: http.DefaultClient,
	}
	for _, name := range []string{"gateway", "gateway-http", "dispatcher", "execution-consumer", "adapter-callback", "settlement", "event-router", "dummy-adapter"} {
		s.addrs[name] = freeAddr(t)
	}
	s.restURL = s.scheme() + s.addrs["gateway-http"]
	if publicTLS {
		s.http = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: caPool(t), MinVersion: tls.VersionTLS12}}}
	}
	// Every REST call of the suite goes through s.http: each is held to the OpenAPI document.
	s.http = contractClient(t, s.http)
	adapterCredential := "adc_" + randomHex(16)
	s.adapterCredential = adapterCredential
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	platformPub, platformKey, err := platformtoken.Generate()
	require.NoError(t, err)
	s.platformKey = platformKey
	s.env = []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + os.Getenv("HOME"),
		"INTEGRATIONS_DATABASE_URL=" + schema.URL,
		"INTEGRATIONS_QUEUE_SCOPE=" + s.queueScope(),
		"INTEGRATIONS_TIME_SCALE=" + fmt.Sprint(scale),
		"INTEGRATIONS_LOG_LEVEL=debug",
		"INTEGRATIONS_SECRET_KEY=" + base64.StdEncoding.EncodeToString(key),
		"INTEGRATIONS_WEBHOOK_ALLOW_HTTP=true",
		"INTEGRATIONS_WEBHOOK_ALLOW_PRIVATE=true",
		"INTEGRATIONS_DISPATCHER_ADDR=" + s.addrs["dispatcher"],
		"INTEGRATIONS_SETTLEMENT_ADDR=" + s.addrs["settlement"],
		"INTEGRATIONS_CALLBACK_ADDR=" + s.addrs["adapter-callback"],
		"INTEGRATIONS_DUMMY_ADAPTER_ADDR=" + s.addrs["dummy-adapter"],
		"INTEGRATIONS_DUMMY_ADAPTER_CREDENTIAL=" + adapterCredential,
		"INTEGRATIONS_PLATFORM_SIGNING_KEY=" + platformtoken.EncodePrivateKey(platformKey),
		"INTEGRATIONS_PLATFORM_PUBLIC_KEYS=" + platformtoken.EncodePublicKey(platformPub),
		"INTEGRATIONS_MAX_PAYLOAD_BYTES=65536",
		"INTEGRATIONS_ADMIN_TOKEN=" + adminToken,
		// Sweep expired leases promptly: the real-time grace for in-flight outcomes is kept
		// short here, where everything is local.
		"INTEGRATIONS_SWEEP_INTERVAL=100ms",
		"INTEGRATIONS_SWEEP_GRACE=100ms",
		// Nothing routes by health here: a short drain window keeps stops and restarts quick.
		"INTEGRATIONS_DRAIN_WINDOW=50ms",
		"INTEGRATIONS_TLS_CA_FILE=" + devca.CAFile(tlsDir),
	}
	s.env = append(s.env, b.env()...)
	if publicTLS {
		s.env = append(s.env, "INTEGRATIONS_CALLBACK_CA_FILE="+devca.CAFile(tlsDir)) // the dummy adapter's callbacks
	}
	c, err := catalog.Parse(mustRead(t, "../deploy/catalog/dev.yaml"), func(name string) (string, bool) {
		switch name {
		case "INTEGRATIONS_DEV_API_KEY":
			return s.apiKey, true
		case "INTEGRATIONS_DUMMY_ADAPTER_ADDR":
			return s.addrs["dummy-adapter"], true
		case "INTEGRATIONS_DUMMY_ADAPTER_CREDENTIAL":
			return adapterCredential, true
		}
		return "", false
	})
	require.NoError(t, err)
	require.NoError(t, catalog.Apply(context.Background(), schema.Pool, c))
	// Cleanups run last-registered first: processes stop, then the scope's queues are deleted.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		port, err := mq.Dial(ctx, s.brokerConfig())
		if err != nil {
			t.Logf("delete queues of %s: %v", s.queueScope(), err)
			return
		}
		defer port.Close()
		if err := port.DeleteRoutes(ctx, routes.Executions, routes.Events); err != nil {
			t.Logf("delete queues of %s: %v", s.queueScope(), err)
		}
	})
	t.Cleanup(s.stopAll)
	return s
}

// start launches the named programs and waits until each reports SERVING.
func (s *stack) start(names ...string) {
	s.t.Helper()
	for _, name := range names {
		s.launch(name, name)
	}
	for _, name := range names {
		s.awaitServing(name)
	}
}

// startInstance launches another instance of a program under its own name and address (a
// second replica), and waits until it is SERVING.
func (s *stack) startInstance(instance, binary string) {
	s.t.Helper()
	s.mu.Lock()
	if _, ok := s.addrs[instance]; !ok {
		s.addrs[instance] = freeAddr(s.t)
	}
	s.mu.Unlock()
	s.launch(instance, binary)
	s.awaitServing(instance)
}

func (s *stack) launch(name, binary string) {
	s.t.Helper()
	{
		env := append(append([]string{}, s.env...), "INTEGRATIONS_GRPC_ADDR="+s.addrs[name])
		env = append(env, identityEnv(binary)...)
		env = append(env, "INTEGRATIONS_METRICS_ADDR="+s.metricsAddr(name))
		if s.publicTLS && clientFacing[binary] {
			env = append(env, "INTEGRATIONS_PUBLIC_TLS_CERT_FILE="+devca.CertFile(tlsDir, devca.Public),
				"INTEGRATIONS_PUBLIC_TLS_KEY_FILE="+devca.KeyFile(tlsDir, devca.Public))
		}
		env = append(env, s.extraEnv[name]...)
		if name == "gateway" {
			env = append(env, "INTEGRATIONS_HTTP_ADDR="+s.addrs["gateway-http"])
		}
		logFile, err := os.Create(filepath.Join(s.logDir, name+".log"))
		require.NoError(s.t, err)
		cmd := exec.Command(filepath.Join(binDir, binary))
		cmd.Env = env
		cmd.Stdout, cmd.Stderr = logFile, logFile
		require.NoError(s.t, cmd.Start(), "start %s", name)
		p := &process{cmd: cmd, done: make(chan struct{})}
		go func() { _ = cmd.Wait(); _ = logFile.Close(); close(p.done) }()
		s.mu.Lock()
		s.procs[name] = p
		s.binaryOf[name] = binary
		s.mu.Unlock()
	}
}

// metricsAddr is the metrics listener's address of an instance, the same across its restarts.
func (s *stack) metricsAddr(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := name + "-metrics"
	if _, ok := s.addrs[key]; !ok {
		s.addrs[key] = freeAddr(s.t)
	}
	return s.addrs[key]
}

// clientFacing are the programs whose port is the clients' (applications', adapters'), not the
// platform's own: TLS with server authentication when publicTLS, never mTLS.
var clientFacing = map[string]bool{"gateway": true, "adapter-callback": true}

// identityEnv is a program's internal identity: its certificate from the run's CA, for the six
// services; nothing for the dummy adapter, which is outside the platform.
func identityEnv(binary string) []string {
	if !slices.Contains(devca.Services, binary) {
		return nil
	}
	return []string{
		"INTEGRATIONS_TLS_CERT_FILE=" + devca.CertFile(tlsDir, binary),
		"INTEGRATIONS_TLS_KEY_FILE=" + devca.KeyFile(tlsDir, binary),
	}
}

// internalAs is the internal identity of the service as, for a test calling an internal port as
// that service would; "" presents no certificate (as a health probe).
func internalAs(t *testing.T, as string) *grpcx.Internal {
	t.Helper()
	files := tlsx.Files{CAFile: devca.CAFile(tlsDir)}
	if as != "" {
		files.CertFile, files.KeyFile = devca.CertFile(tlsDir, as), devca.KeyFile(tlsDir, as)
	}
	in, err := grpcx.NewInternal(files)
	require.NoError(t, err)
	return in
}

func caPool(t *testing.T) *x509.CertPool {
	t.Helper()
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(mustRead(t, devca.CAFile(tlsDir))))
	return pool
}

// dial connects to an instance as its clients do: a client-facing port plainly or with TLS (the
// stack's publicTLS), an internal one with mTLS presenting the certificate of the service as
// ("" for none, as a health probe), the dummy adapter plainly.
func (s *stack) dialAs(name, as string) *grpc.ClientConn {
	s.t.Helper()
	s.mu.Lock()
	binary, ok := s.binaryOf[name]
	s.mu.Unlock()
	if !ok {
		binary = name
	}
	var opts []grpc.DialOption
	switch {
	case clientFacing[binary]:
		if s.publicTLS {
			opt, err := grpcx.PublicDialOption(devca.CAFile(tlsDir))
			require.NoError(s.t, err)
			opts = append(opts, opt)
		}
	case slices.Contains(devca.Services, binary):
		opts = append(opts, internalAs(s.t, as).DialOption(binary))
	}
	conn, err := grpcx.Dial(s.addrs[name], opts...)
	require.NoError(s.t, err)
	s.t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// scheme is the REST listeners' URL scheme with "://".
func (s *stack) scheme() string {
	if s.publicTLS {
		return "https://"
	}
	return "http://"
}

// dial connects to an instance (see dialAs) without a client certificate.
func (s *stack) dial(name string) *grpc.ClientConn { return s.dialAs(name, "") }

func (s *stack) awaitServing(name string) {
	s.t.Helper()
	conn := s.dial(name)
	defer conn.Close()
	client := grpc_health_v1.NewHealthClient(conn)
	deadline := time.Now().Add(s.timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := client.Check(ctx, &grpc_health_v1.HealthCheckRequest{})
		cancel()
		if err == nil && resp.GetStatus() == grpc_health_v1.HealthCheckResponse_SERVING {
			return
		}
		select {
		case <-s.procs[name].done:
			s.t.Fatalf("%s exited during start-up:\n%s", name, s.logTail(name))
		default:
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%s not serving after %s (last error %v):\n%s", name, s.timeout, err, s.logTail(name))
		}
		time.Sleep(50 * time.Millisecond) // polling a health endpoint: there is no event to await
	}
}

// stop sends SIGTERM and waits for a graceful exit.
func (s *stack) stop(name string) {
	s.mu.Lock()
	p := s.procs[name]
	delete(s.procs, name)
	s.mu.Unlock()
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// kill ends a program with SIGKILL: no graceful shutdown, as in a crash.
func (s *stack) kill(name string) {
	s.mu.Lock()
	p := s.procs[name]
	delete(s.procs, name)
	s.mu.Unlock()
	require.NotNil(s.t, p, "%s is not running", name)
	require.NoError(s.t, p.cmd.Process.Kill())
	<-p.done
}

func (s *stack) stopAll() {
	s.mu.Lock()
	names := make([]string, 0, len(s.procs))
	for n := range s.procs {
		names = append(names, n)
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, n := range names {
		wg.Add(1)
		go func() { defer wg.Done(); s.stop(n) }()
	}
	wg.Wait()
	if s.t.Failed() {
		for _, n := range append(names, "gateway") {
			s.t.Logf("--- %s log (tail) ---\n%s", n, s.logTail(n))
		}
	}
}

func (s *stack) logTail(name string) string {
	b, _ := os.ReadFile(filepath.Join(s.logDir, name+".log"))
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	return strings.Join(lines, "\n")
}

// log returns a program's whole log so far.
func (s *stack) log(name string) string {
	b, _ := os.ReadFile(filepath.Join(s.logDir, name+".log"))
	return string(b)
}

// call makes a REST call with the stack's API key (unless key is given) and decodes the JSON
// answer into a map.
func (s *stack) call(method, path, key string, body []byte, headers ...string) (int, map[string]any) {
	s.t.Helper()
	req, err := http.NewRequest(method, s.restURL+path, bytes.NewReader(body))
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

// freeAddr returns a loopback address for a program the stack starts (see pkg/freeport).
func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := freeport.Addr()
	require.NoError(t, err)
	return addr
}

func amqpURL() string {
	if u := os.Getenv("INTEGRATIONS_AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// broker is a message broker a stack runs on: a provider of the port and its URL.
type broker struct {
	provider string // mq.ProviderRabbitMQ or mq.ProviderSTOMP
	url      string
}

// rabbitMQBroker is INTEGRATIONS_AMQP_URL's RabbitMQ, which every stack uses unless told otherwise.
func rabbitMQBroker() broker { return broker{provider: mq.ProviderRabbitMQ, url: amqpURL()} }

// stompBroker is the STOMP broker of INTEGRATIONS_STOMP_URL (scripts/deps.sh up stomp starts an
// ActiveMQ and writes it to .run/deps.env; make test does). Without it the test fails, never
// skips: a run that leaves STOMP out must say so.
func stompBroker(t *testing.T) broker {
	t.Helper()
	u := os.Getenv("INTEGRATIONS_STOMP_URL")
	require.NotEmpty(t, u, "INTEGRATIONS_STOMP_URL is not set: a STOMP stack needs a STOMP broker "+
		"(scripts/deps.sh up stomp && set -a && . .run/deps.env && set +a)")
	return broker{provider: mq.ProviderSTOMP, url: u}
}

// env is what the services are told of the broker.
func (b broker) env() []string {
	if b.provider == mq.ProviderSTOMP {
		return []string{
			"INTEGRATIONS_BROKER=" + mq.ProviderSTOMP,
			"INTEGRATIONS_STOMP_URL=" + b.url,
			// Nothing of a STOMP stack may still reach RabbitMQ: a closed port makes any use of
			// INTEGRATIONS_AMQP_URL fail instead of quietly working.
			"INTEGRATIONS_AMQP_URL=amqp://guest:guest@127.0.0.1:1/",
		}
	}
	return []string{"INTEGRATIONS_BROKER=" + mq.ProviderRabbitMQ, "INTEGRATIONS_AMQP_URL=" + b.url}
}

// queueScope is the stack's INTEGRATIONS_QUEUE_SCOPE: its schema's name, unique per test, keeps
// tests' queues apart on either broker.
func (s *stack) queueScope() string { return "e2e." + s.schema.Name }

// brokerConfig is the port's configuration for a test to reach the stack's queues as its
// services do.
func (s *stack) brokerConfig() mq.Config {
	return mq.Config{Provider: s.broker.provider, URL: s.broker.url, Scope: s.queueScope(), TimeScale: s.scale}
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
