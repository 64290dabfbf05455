package main

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/integrations-platform/integrations/pkg/version"
)

// TestEveryBinarySaysItsRelease builds the nine programs make build builds, with the linker flag
// it passes, and asks each for its release: `integrationsctl version` (and --version), `-version`
// or `--version` for the others. Asking must not need a database, a broker or any variable.
func TestEveryBinarySaysItsRelease(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds every binary")
	}
	const module = "github.com/integrations-platform/integrations/"
	const release = "v0.1.0-7-g3f2a9c1-dirty"
	dir := t.TempDir()
	services := []string{"gateway", "dispatcher", "execution-consumer", "adapter-callback", "settlement", "event-router"}
	args := []string{"build", "-ldflags", "-X " + version.LinkerSymbol + "=" + release, "-o", dir + "/"}
	for _, s := range services {
		args = append(args, module+"services/"+s)
	}
	args = append(args, module+"cmd/integrationsctl", module+"cmd/dummy-adapter", module+"cmd/demo-consumer")
	out, err := exec.Command("go", args...).CombinedOutput()
	require.NoError(t, err, "go build: %s", out)

	type ask struct{ program, arg string }
	var asks []ask
	for _, s := range append(services, "dummy-adapter", "demo-consumer") {
		asks = append(asks, ask{s, "-version"}, ask{s, "--version"})
	}
	asks = append(asks, ask{"integrationsctl", "version"}, ask{"integrationsctl", "--version"})
	for _, a := range asks {
		cmd := exec.Command(filepath.Join(dir, a.program), a.arg)
		cmd.Env = []string{} // nothing configured: the answer must come before any configuration
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		require.NoError(t, cmd.Run(), "%s %s: %s", a.program, a.arg, stderr.String())
		require.Regexp(t, `^`+a.program+` `+release+` \(go[0-9.]+\S* \w+/\w+\)\n$`, stdout.String(), "%s %s", a.program, a.arg)
	}
}
