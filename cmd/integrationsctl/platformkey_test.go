package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/sdk/go/platformtoken"
)

func runCtl(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := root()
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	err = cmd.Execute()
	return out.String(), errOut.String(), err
}

// TestPlatformKeyGenerate: the private key goes only into a new 0600 file, never to the output;
// the public key printed is the private key's, and `public` prints it again.
func TestPlatformKeyGenerate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	priv, pub := filepath.Join(dir, "signing.key"), filepath.Join(dir, "public.key")

	stdout, stderr, err := runCtl(t, "platform-key", "generate", "--private-key", priv, "--public-key", pub)
	require.NoError(t, err)
	info, err := os.Stat(priv)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	signer, err := platformtoken.SignerConfig{SigningKeyFile: priv}.Signer()
	require.NoError(t, err)
	key, kid := signer.PublicKey()
	require.Equal(t, platformtoken.EncodePublicKey(key), strings.TrimSpace(stdout))
	written, err := os.ReadFile(pub)
	require.NoError(t, err)
	require.Equal(t, stdout, string(written))
	require.Contains(t, stderr, kid)
	raw, err := os.ReadFile(priv)
	require.NoError(t, err)
	require.NotContains(t, stdout+stderr, strings.TrimSpace(string(raw)), "the private key is not printed")

	_, _, err = runCtl(t, "platform-key", "generate", "--private-key", priv)
	require.ErrorContains(t, err, "exists", "an existing key is never overwritten")
	_, _, err = runCtl(t, "platform-key", "generate")
	require.ErrorContains(t, err, "--private-key")

	again, _, err := runCtl(t, "platform-key", "public", "--private-key", priv)
	require.NoError(t, err)
	require.Equal(t, stdout, again)
}
