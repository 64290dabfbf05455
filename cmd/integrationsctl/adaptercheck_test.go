package main

import (
	"crypto/ed25519"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/integrations-platform/integrations/cmd/internal/dummy"
	"github.com/integrations-platform/integrations/pkg/freeport"
	"github.com/integrations-platform/integrations/sdk/go/adapter"
	"github.com/integrations-platform/integrations/sdk/go/platformtoken"
)

// freeAddr is a loopback address free a moment ago: the callback address the adapter is
// configured with before the check listens on it.
func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := freeport.Addr() // outside the ephemeral range: a closed port there can connect to itself
	require.NoError(t, err)
	return addr
}

// TestAdapterCheckPassesOnTheDummyAdapter: the dummy adapter, configured as an author would from
// the command's help (the check's public key, its callback address), passes every rule; its
// echo answers sync calls and complete_later gives accepted work that outlasts the lease.
func TestAdapterCheckPassesOnTheDummyAdapter(t *testing.T) {
	t.Parallel()
	pub, priv, err := platformtoken.Generate()
	require.NoError(t, err)
	keyFile := filepath.Join(t.TempDir(), "check.key")
	require.NoError(t, os.WriteFile(keyFile, []byte(platformtoken.EncodePrivateKey(priv)+"\n"), 0o600))
	callbackAddr := freeAddr(t)

	ad, err := adapter.New(dummy.NewHandler(zap.NewNop(), nil), adapter.Options{
		CallbackAddr: callbackAddr, Credential: "dummy-credential", AdapterID: "dummy", PlatformKeys: []ed25519.PublicKey{pub},
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ad.Close() })
	srv := grpc.NewServer()
	ad.Register(srv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	stdout, _, err := runCtl(t, "adapter", "check", "--addr", lis.Addr().String(), "--adapter-id", "dummy",
		"--platform-key", keyFile, "--callback-listen", callbackAddr, "--credential", "dummy-credential",
		"--capability", dummy.Capability, "--payload", `{"n": 1}`,
		"--long-payload", `{"dummy": {"complete_later_ms": 3500}}`, "--lease", "2s", "--timeout", "10s")
	t.Log("\n" + stdout)
	require.NoError(t, err)
	require.Contains(t, stdout, "INTEGRATIONS_PLATFORM_PUBLIC_KEYS="+platformtoken.EncodePublicKey(pub))
	require.Contains(t, stdout, "12 rules: 12 passed, 0 failed, 0 warned, 0 skipped")
	for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
		require.NotContains(t, line, "FAIL", line)
	}
}

// TestAdapterCheckFailsNamingTheRule: a failed rule exits 1 naming every rule that failed; here
// the dummy started without the check's public key, which refuses every token "key" first — the
// line of the valid call says what to fix.
func TestAdapterCheckFailsNamingTheRule(t *testing.T) {
	t.Parallel()
	other, _, err := platformtoken.Generate()
	require.NoError(t, err)
	_, priv, err := platformtoken.Generate()
	require.NoError(t, err)
	keyFile := filepath.Join(t.TempDir(), "check.key")
	require.NoError(t, os.WriteFile(keyFile, []byte(platformtoken.EncodePrivateKey(priv)+"\n"), 0o600))
	ad, err := adapter.New(dummy.NewHandler(zap.NewNop(), nil), adapter.Options{
		CallbackAddr: freeAddr(t), AdapterID: "dummy", PlatformKeys: []ed25519.PublicKey{other},
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ad.Close() })
	srv := grpc.NewServer()
	ad.Register(srv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	stdout, _, err := runCtl(t, "adapter", "check", "--addr", lis.Addr().String(), "--adapter-id", "dummy",
		"--platform-key", keyFile, "--capability", dummy.Capability, "--timeout", "10s")
	t.Log("\n" + stdout)
	require.EqualError(t, err, "adapter check: 5 rules failed: expired-refused, replayed-refused, audience-refused, binding-refused, answers-within-deadline")
	require.Contains(t, stdout, `FAIL  expired-refused                  refused with check "key", want "invalid" (§6 orders the checks)`)
	require.Contains(t, stdout, `FAIL  answers-within-deadline          a valid sync call was not answered: refused, check "key": the adapter does not hold the check's public key (INTEGRATIONS_PLATFORM_PUBLIC_KEYS)`)
	require.Contains(t, stdout, "SKIP  lease-renewed")
}
