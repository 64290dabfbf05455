package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/integrations-platform/integrations/pkg/db/dbtest"
)

// runMainEnv makes the test binary run the gateway's main instead of the tests: the start-up
// tests below run the real gateway as a process of its own, as an operator would.
const runMainEnv = "INTEGRATIONS_GATEWAY_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// output is a process's stdout and stderr, read while it runs.
type output struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.Write(p)
}

func (o *output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// gateway returns the gateway's command on the schema, with listeners at grpc and http, and
// nothing of the test's own environment.
// The process is killed when ctx ends.
func gateway(ctx context.Context, t *testing.T, s *dbtest.Schema, grpc, http string, extra ...string) (*exec.Cmd, *output) {
	t.Helper()
	secretKey := make([]byte, 32)
	_, err := rand.Read(secretKey)
	require.NoError(t, err)
	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = append([]string{
		runMainEnv + "=1",
		"PATH=" + os.Getenv("PATH"),
		"INTEGRATIONS_DATABASE_URL=" + s.URL,
		"INTEGRATIONS_SECRET_KEY=" + base64.StdEncoding.EncodeToString(secretKey),
		"INTEGRATIONS_PLATFORM_SIGNING_KEY=" + base64.StdEncoding.EncodeToString(make([]byte, ed25519.SeedSize)),
		"INTEGRATIONS_INTERNAL_PLAINTEXT=true",
		"INTEGRATIONS_GRPC_ADDR=" + grpc,
		"INTEGRATIONS_HTTP_ADDR=" + http,
		"INTEGRATIONS_SHUTDOWN_TIMEOUT=1s",
	}, extra...)
	var out output
	cmd.Stdout, cmd.Stderr = &out, &out
	return cmd, &out
}

// TestWeakCatalogKeyStopsTheGatewayOffLoopback: a catalog key that catalog apply recorded weak
// stops a gateway listening on a non-loopback address at start, naming the application and the
// field; on loopback (make run, the e2e stacks) the gateway starts and warns.
func TestWeakCatalogKeyStopsTheGatewayOffLoopback(t *testing.T) {
	t.Parallel()
	s := dbtest.NewSchema(t)
	s.ApplyCatalog(t, dbtest.TestCatalog) // its api_key is 23 typed characters

	// A gateway that does not stop would serve: the deadline turns that into a failure, not a hang.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd, out := gateway(ctx, t, s, "0.0.0.0:0", "127.0.0.1:0", "INTEGRATIONS_PUBLIC_PLAINTEXT=true")
	err := cmd.Run()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "the gateway stops at start: %s", out)
	assert.Equal(t, 1, exit.ExitCode())
	assert.Contains(t, out.String(), "gateway: catalog api_key of application "+dbtest.TestApp+": recorded weak by catalog apply")
	assert.NotContains(t, out.String(), dbtest.TestAPIKey, "the key itself is never printed")
	assert.NotContains(t, out.String(), "service started")

	cmd, out = gateway(t.Context(), t, s, "127.0.0.1:0", "127.0.0.1:0")
	require.NoError(t, cmd.Start())
	require.Eventually(t, func() bool { return strings.Contains(out.String(), `"service started"`) },
		20*time.Second, 10*time.Millisecond, "the gateway starts on loopback: %s", out)
	assert.Contains(t, out.String(), `"weak catalog key allowed on loopback"`)
	assert.Contains(t, out.String(), "catalog api_key of application "+dbtest.TestApp+" is weak")
	assert.NotContains(t, out.String(), dbtest.TestAPIKey)
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait(), "a clean stop: %s", out)
}
