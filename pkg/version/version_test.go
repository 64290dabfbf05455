package version

import (
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestResolve(t *testing.T) {
	t.Parallel()
	vcs := func(rev, modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}
	}
	const rev = "3f2a9c1b7d4e5f60718293a4b5c6d7e8f9a0b1c2"
	tests := []struct {
		name   string
		linked string
		info   *debug.BuildInfo
		want   string
	}{
		{"linker wins over everything", "v0.1.0", &debug.BuildInfo{Main: debug.Module{Version: "v0.0.9"}, Settings: vcs(rev, "true")}, "v0.1.0"},
		{"linker value from git describe, dirty", " v0.1.0-3-g3f2a9c1-dirty\n", nil, "v0.1.0-3-g3f2a9c1-dirty"},
		{"module version of go install", "", &debug.BuildInfo{Main: debug.Module{Version: "v0.1.0"}}, "v0.1.0"},
		{"checkout build: the revision", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs(rev, "false")}, "0.2.0-dev+3f2a9c1b7d4e"},
		{"checkout build with changes", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs(rev, "true")}, "0.2.0-dev+3f2a9c1b7d4e.dirty"},
		{"no VCS stamp", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, Fallback},
		{"no build info", "", nil, Fallback},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, resolve(tt.linked, tt.info))
		})
	}
}

func TestRequested(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args []string
		want bool
	}{
		{[]string{"-version"}, true},
		{[]string{"--version"}, true},
		{nil, false},
		{[]string{"version"}, false},
		{[]string{"-version", "extra"}, false},
		{[]string{"-v"}, false},
	} {
		require.Equal(t, tt.want, Requested(tt.args), "%q", tt.args)
	}
}

func TestLine(t *testing.T) {
	t.Parallel()
	line := Line("settlement")
	require.True(t, strings.HasPrefix(line, "settlement "+String()+" (go"), line)
}

// TestLinkerSymbol builds a program with the linker flag make build passes and checks that the
// release it prints is the one given: a renamed variable would leave -X silently without effect.
func TestLinkerSymbol(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds a program")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "printversion")
	build := exec.Command("go", "build", "-ldflags", "-X "+LinkerSymbol+"=v9.8.7-test", "-o", bin, "./testdata/printversion")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	out, err = exec.Command(bin).Output()
	require.NoError(t, err)
	require.Equal(t, "v9.8.7-test\n", string(out))
}
