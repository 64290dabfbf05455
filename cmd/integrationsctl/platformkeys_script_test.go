package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/integrations-platform/integrations/sdk/go/platformtoken"
)

// asCtl makes the test binary run as integrationsctl (for the scripts it is given to), when set.
const asCtl = "INTEGRATIONSCTL_TEST_RUN_AS_CTL"

func TestMain(m *testing.M) {
	if os.Getenv(asCtl) == "1" {
		cmd := root()
		cmd.SetArgs(os.Args[1:])
		if err := cmd.Execute(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// TestPlatformKeysScript: scripts/platform-keys.sh (run by `make run`) makes the key pair once and
// keeps it; an empty key file left by an interrupted run is replaced, not refused forever.
func TestPlatformKeysScript(t *testing.T) {
	t.Parallel()
	self, err := os.Executable()
	require.NoError(t, err)
	ctl := filepath.Join(t.TempDir(), "integrationsctl")
	require.NoError(t, os.WriteFile(ctl, []byte("#!/bin/sh\n"+asCtl+"=1 exec '"+self+"' \"$@\"\n"), 0o700))
	script, err := filepath.Abs("../../scripts/platform-keys.sh")
	require.NoError(t, err)
	dir := t.TempDir()
	signing, public := filepath.Join(dir, "platform-signing.key"), filepath.Join(dir, "platform-public.key")
	run := func() {
		t.Helper()
		out, err := exec.Command("bash", script, ctl, dir).CombinedOutput()
		require.NoError(t, err, "%s", out)
		signer, err := platformtoken.SignerConfig{SigningKeyFile: signing}.Signer()
		require.NoError(t, err)
		keys, err := platformtoken.PublicKeysConfig{PublicKeysFile: public}.Keys()
		require.NoError(t, err)
		pub, _ := signer.PublicKey()
		require.Equal(t, []byte(pub), []byte(keys[0]), "the public key is the signing key's")
	}
	read := func(p string) string {
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		return strings.TrimSpace(string(b))
	}

	run()
	key := read(signing)
	run()
	require.Equal(t, key, read(signing), "kept")

	// Interrupted: the key file created, nothing written yet (and the public file truncated).
	require.NoError(t, os.WriteFile(signing, nil, 0o600))
	require.NoError(t, os.WriteFile(public, nil, 0o600))
	run()
	require.NotEqual(t, key, read(signing), "a new key replaces the empty file")

	// The public half lost alone is derived again from the key.
	key = read(signing)
	require.NoError(t, os.WriteFile(public, nil, 0o600))
	run()
	require.Equal(t, key, read(signing))
}
