// Package version says which release a program is. Every binary of the repository prints it
// (`integrationsctl version`, `-version` for the others) and logs it when it starts.
//
// The release comes from, in order:
//  1. the linker: `make build` and `make images` set it with
//     -ldflags "-X github.com/integrations-platform/integrations/pkg/version.release=$(git describe --tags --match 'v[0-9]*' --always --dirty)";
//  2. the module's build info: the module version when the binary was built with
//     `go install …@v0.1.0`, else the VCS revision the Go toolchain stamped, as Fallback plus
//     build metadata (`0.2.0-dev+3f2a9c1b7d4e`, `.dirty` when the tree had changes);
//  3. Fallback.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
)

// LinkerSymbol is the variable -ldflags "-X" sets to the release.
const LinkerSymbol = "github.com/integrations-platform/integrations/pkg/version.release"

// Fallback is the release of a build that says nothing else about itself: the next release, in
// development. Raised after a release is tagged (CONTRIBUTING.md, "Releases").
const Fallback = "0.2.0-dev"

// release is set by the linker (LinkerSymbol); empty otherwise.
var release string

var resolved = sync.OnceValue(func() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		info = nil
	}
	return resolve(release, info)
})

// String is the program's release, e.g. "v0.1.0", "v0.1.0-3-g3f2a9c1-dirty" or "0.2.0-dev".
func String() string { return resolved() }

// Line is what a program prints when asked its version: its name, release, Go version and
// platform, e.g. "settlement v0.1.0 (go1.26.0 linux/amd64)".
func Line(program string) string {
	return fmt.Sprintf("%s %s (%s %s/%s)", program, String(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// Requested reports whether a program's arguments ask for its version: one argument, -version or
// --version. The services take no other arguments; their configuration is the environment.
func Requested(args []string) bool {
	return len(args) == 1 && (args[0] == "-version" || args[0] == "--version")
}

// resolve picks the release from the linker's value, else the build info, else Fallback.
func resolve(linked string, info *debug.BuildInfo) string {
	if v := strings.TrimSpace(linked); v != "" {
		return v
	}
	if info == nil {
		return Fallback
	}
	// A workspace or checkout build says "(devel)"; `go install module@version` names the version.
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var revision string
	var modified bool
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if revision == "" {
		return Fallback
	}
	if len(revision) > 12 {
		revision = revision[:12]
	}
	v := Fallback + "+" + revision
	if modified {
		v += ".dirty"
	}
	return v
}
