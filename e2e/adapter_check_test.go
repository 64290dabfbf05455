package e2e

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/integrations-platform/integrations/pkg/adaptercheck"
	"github.com/integrations-platform/integrations/sdk/go/platformtoken"
)

// TestTypeScriptAdapterPassesTheConformanceCheck: the adapter conformance check
// (`integrationsctl adapter check`, pkg/adaptercheck) passes every rule on the TypeScript example
// adapter (examples/adapter-typescript, on sdk/typescript/adapter), as it does on the dummy
// adapter (cmd/integrationsctl's TestAdapterCheckPassesOnTheDummyAdapter): one check, two
// implementations of the protocol in two languages. No platform is needed: the check plays it.
func TestTypeScriptAdapterPassesTheConformanceCheck(t *testing.T) {
	t.Parallel()
	node := nodeOrSkip(t, typeScriptExample, "../sdk/typescript/adapter")
	_, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	callbacks, err := net.Listen("tcp", "127.0.0.1:0") // held open: the check serves on it
	require.NoError(t, err)
	addr := freeAddr(t)
	const credential = "adc_conformance-check-credential"
	startNodeAdapter(t, node, []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + os.Getenv("HOME"),
		"ADAPTER_ADDR=" + addr,
		"ADAPTER_ID=greeter",
		"ADAPTER_CREDENTIAL=" + credential,
		"INTEGRATIONS_PLATFORM_PUBLIC_KEYS=" + platformtoken.EncodePublicKey(key.Public().(ed25519.PublicKey)),
		"INTEGRATIONS_CALLBACK_ADDR=" + callbacks.Addr().String(),
	}, addr)

	payload, err := structpb.NewStruct(map[string]any{"name": "check"})
	require.NoError(t, err)
	// Long work: 32 progress steps of 250 ms outlast a 4 s lease, so it must renew; the lease and
	// its grace are the CLI's defaults doubled, for a loaded machine.
	long, err := structpb.NewStruct(map[string]any{"name": "check", "steps": 32, "step_ms": 250})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	report, err := adaptercheck.Run(ctx, adaptercheck.Config{
		Addr: addr, AdapterID: "greeter", Key: key, Credential: credential,
		Capability: "greeter.greet", Payload: payload, LongPayload: long, Callbacks: callbacks,
		Lease: 2 * adaptercheck.DefaultLease, LeaseGrace: 2 * adaptercheck.DefaultLeaseGrace,
	})
	require.NoError(t, err)
	var out strings.Builder
	require.NoError(t, report.Write(&out))
	t.Logf("adapter check on examples/adapter-typescript:\n%s", out.String())
	require.Empty(t, report.Failed(), "every rule passes on the TypeScript example")
	require.NotContains(t, out.String(), "SKIP", "the long-work rules ran too")
}
