package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/freeport"
	"github.com/integrations-platform/integrations/pkg/tlsx/devca"
)

// typeScriptClient is sdk/typescript/client, the client SDK whose types openapi-typescript
// generates from the OpenAPI document.
const typeScriptClient = "../sdk/typescript/client"

// TestTypeScriptClient runs sdk/typescript/client/e2e/every-field.js with node against a running
// platform: through the client and its generated types it reads every field of the answers of
// invoke (async and sync), get, list (three pages), timeline, cancel, events and consumer
// registration, each held to the document's schema, with every field of each schema reached seen
// at least once; and it receives the webhooks on a server of its own and verifies them with the
// SDK's helper (after a secret rotation). Then examples/client-typescript makes its first call and
// verifies its webhook.
func TestTypeScriptClient(t *testing.T) {
	node := nodeOrSkip(t, typeScriptClient)
	s := newStack(t)
	// A capability whose progress reports are delivered as execution.progress events too, so that
	// the progress webhook's body is read as well; a lease that outlasts the run.
	s.schema.ApplyCatalog(t, lifecycleCapabilities(s)+`
  - name: dummy.progress
    adapter: dummy
    modes: [async, sync]
    lease: 24h
    progress_events: true
`)
	s.start("settlement", "adapter-callback", "dummy-adapter", "execution-consumer", "event-router", "dispatcher", "gateway")

	// The document as JSON, for the script's schema walker (Node has no YAML parser of its own).
	doc, err := openapi3.NewLoader().LoadFromFile(openAPIPath)
	require.NoError(t, err)
	raw, err := json.Marshal(doc)
	require.NoError(t, err)
	docPath := filepath.Join(t.TempDir(), "integrations.openapi.json")
	require.NoError(t, os.WriteFile(docPath, raw, 0o600))

	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + os.Getenv("HOME"),
		"INTEGRATIONS_URL=" + s.RESTURL,
		"INTEGRATIONS_API_KEY=" + s.APIKey,
		"INTEGRATIONS_OPENAPI_JSON=" + docPath,
		"ECHO=dummy.echo",
		"PROGRESS=dummy.progress",
		// A CA for the gRPC consumer registered with ca_pem: the run's throwaway one.
		"GRPC_CA_FILE=" + devca.CAFile(tlsDir),
	}
	if s.PublicTLS() {
		env = append(env, "NODE_EXTRA_CA_CERTS="+devca.CAFile(tlsDir))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "--test", "--test-reporter=spec", "e2e/every-field.js")
	cmd.Dir = typeScriptClient
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	t.Logf("node --test e2e/every-field.js:\n%s", strings.TrimSpace(string(out)))
	require.NoError(t, err, "the TypeScript client's every-field run failed (output above)")
	require.Contains(t, string(out), "every-field: ", "the run printed its count of fields")

	// The example application, run as its README runs it: its first call, and the webhook it
	// receives verified.
	example := "../examples/client-typescript"
	nodeOrSkip(t, example)
	receiver, err := freeport.Addr()
	require.NoError(t, err)
	run := exec.CommandContext(ctx, node, "main.js")
	run.Dir = example
	run.Env = append(env, "RECEIVER_ADDR="+receiver, "CAPABILITY=dummy.echo")
	out, err = run.CombinedOutput()
	t.Logf("node main.js (examples/client-typescript):\n%s", strings.TrimSpace(string(out)))
	require.NoError(t, err, "the example failed (output above)")
	require.Regexp(t, `verified webhook \S+: execution.completed succeeded`, string(out))
}
