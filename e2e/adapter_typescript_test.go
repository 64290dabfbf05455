package e2e

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/health/grpc_health_v1"

	"github.com/integrations-platform/integrations/pkg/catalog"
	"github.com/integrations-platform/integrations/pkg/grpcx"
	"github.com/integrations-platform/integrations/pkg/tlsx/devca"
	"github.com/integrations-platform/integrations/sdk/go/platformtoken"
)

// requireNodeEnv, set to 1, makes a missing node or a missing npm install of the TypeScript
// example fail the test instead of skipping it (.ci/run sets it: in CI it must run).
const requireNodeEnv = "INTEGRATIONS_E2E_REQUIRE_NODE"

// typeScriptExample is examples/adapter-typescript, on sdk/typescript/adapter.
const typeScriptExample = "../examples/adapter-typescript"

// TestTypeScriptAdapter runs the TypeScript adapter example (examples/adapter-typescript) with
// node, registered in the catalog as its README says, against the running platform: a sync
// execution settles succeeded from the call's answer, and an async one is answered Accepted and
// settles through the callbacks, its progress reported on the way.
func TestTypeScriptAdapter(t *testing.T) {
	node := nodeOrSkip(t, typeScriptExample, "../sdk/typescript/adapter")
	s := newStack(t)

	addr := freeAddr(t)
	credential := "adc_" + randomHex(16)
	entry := fmt.Sprintf(`adapters:
  - id: greeter
    name: Greeter (examples/adapter-typescript)
    endpoint: %s
    credential: %s
capabilities:
  - name: greeter.greet
    adapter: greeter
    modes: [async, sync]
    max_attempts: 3
    async_budget: 24h
    retry_delays: [1m]
    lease: 10h
    sync_timeout: 30s
`, addr, credential)
	c, err := catalog.Parse([]byte(entry), nil)
	require.NoError(t, err)
	require.NoError(t, catalog.Apply(context.Background(), s.schema.Pool, c))
	s.start("settlement", "adapter-callback", "execution-consumer", "dispatcher", "gateway")

	pub := s.PlatformKey.Public().(ed25519.PublicKey)
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + os.Getenv("HOME"),
		"ADAPTER_ADDR=" + addr,
		"ADAPTER_ID=greeter",
		"ADAPTER_CREDENTIAL=" + credential,
		"INTEGRATIONS_PLATFORM_PUBLIC_KEYS=" + platformtoken.EncodePublicKey(pub),
		"INTEGRATIONS_CALLBACK_ADDR=" + s.Addrs["adapter-callback"],
	}
	if s.PublicTLS() {
		env = append(env, "INTEGRATIONS_CALLBACK_CA_FILE="+devca.CAFile(tlsDir))
	}
	logPath := startNodeAdapter(t, node, env, addr)
	adapterLog := func() string { b, _ := os.ReadFile(logPath); return string(b) }

	// Sync: the answer of the call settles it.
	code, body := s.call(http.MethodPost, "/v1/capabilities/greeter.greet:invoke", s.APIKey,
		[]byte(`{"mode": "MODE_SYNC", "payload": {"name": "Ada"}}`))
	require.Equal(t, http.StatusOK, code, "%v\nadapter log:\n%s", body, adapterLog())
	e := execution(body)
	require.Equal(t, "EXECUTION_STATUS_SUCCEEDED", e["status"], "%v", body)
	assert.Equal(t, map[string]any{"greeting": "Hello, Ada!"}, e["result"])

	// Async: Accepted, three progress reports, the completion through the callbacks.
	code, body = s.call(http.MethodPost, "/v1/capabilities/greeter.greet:invoke", s.APIKey,
		[]byte(`{"mode": "MODE_ASYNC", "payload": {"name": "Grace", "steps": 3, "step_ms": 100}}`))
	require.Equal(t, http.StatusAccepted, code, "%v", body)
	id, _ := execution(body)["id"].(string)
	require.NotEmpty(t, id)
	require.Eventually(t, func() bool {
		_, body := s.call(http.MethodGet, "/v1/executions/"+id, s.APIKey, nil)
		st, _ := execution(body)["status"].(string)
		return st == "EXECUTION_STATUS_SUCCEEDED" || st == "EXECUTION_STATUS_FAILED"
	}, 60*time.Second, 50*time.Millisecond, "the async execution settles\nadapter log:\n%s", adapterLog())
	_, body = s.call(http.MethodGet, "/v1/executions/"+id, s.APIKey, nil)
	e = execution(body)
	require.Equal(t, "EXECUTION_STATUS_SUCCEEDED", e["status"], "%v\nadapter log:\n%s", body, adapterLog())
	assert.Equal(t, map[string]any{"greeting": "Hello, Grace!", "steps": float64(3)}, e["result"])
	assert.Equal(t, map[string]any{"step": float64(3), "of": float64(3)}, e["progress"], "the last progress reported")

	// Through the callbacks: the outcome went by Complete (the SDK logs its delivery), the lease
	// was renewed meanwhile, and no call of the platform's was refused.
	log := adapterLog()
	assert.Contains(t, log, `"msg":"outcome delivered"`)
	assert.Contains(t, log, `"execution_id":"`+id+`"`)
	assert.NotContains(t, log, "call refused", "every platform call carried a valid token")
}

// nodeOrSkip is the node binary, with the dependencies of each npm package in dirs installed;
// without them the test skips, or fails when requireNodeEnv is 1.
func nodeOrSkip(t *testing.T, dirs ...string) string {
	t.Helper()
	missing := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		if os.Getenv(requireNodeEnv) == "1" {
			t.Fatalf("%s and %s=1", msg, requireNodeEnv)
		}
		t.Skipf("%s (set %s=1 to fail instead)", msg, requireNodeEnv)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		missing("no node binary on PATH: the TypeScript packages need Node 20 or later")
		return ""
	}
	for _, dir := range dirs {
		if _, err := os.Stat(filepath.Join(dir, "node_modules")); err != nil {
			missing("%s has no node_modules: run npm ci there (scripts/offline.sh --fetch does)", dir)
			return ""
		}
	}
	return node
}

// startNodeAdapter starts the example with node and waits until its health service says SERVING;
// it is stopped with SIGTERM when the test ends. It returns the path of its log.
func startNodeAdapter(t *testing.T, node string, env []string, addr string) string {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), "adapter-typescript.log")
	logFile, err := os.Create(logPath)
	require.NoError(t, err)
	cmd := exec.Command(node, "main.js")
	cmd.Dir = typeScriptExample
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logFile, logFile
	require.NoError(t, cmd.Start())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); _ = logFile.Close(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("--- adapter-typescript log ---\n%s", strings.TrimSpace(string(b)))
		}
	})

	conn, err := grpcx.Dial(addr)
	require.NoError(t, err)
	defer conn.Close()
	health := grpc_health_v1.NewHealthClient(conn)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := health.Check(ctx, &grpc_health_v1.HealthCheckRequest{})
		cancel()
		if err == nil && resp.GetStatus() == grpc_health_v1.HealthCheckResponse_SERVING {
			return logPath
		}
		select {
		case <-done:
			b, _ := os.ReadFile(logPath)
			t.Fatalf("the TypeScript adapter exited during start-up:\n%s", b)
		default:
		}
		require.True(t, time.Now().Before(deadline), "the TypeScript adapter is not serving after 30 s (last error %v)", err)
		time.Sleep(50 * time.Millisecond) // polling a health endpoint: there is no event to await
	}
}
