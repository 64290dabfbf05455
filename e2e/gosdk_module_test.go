package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"
)

// goSDKRelease is the version the outside module requires of the SDK, which the test publishes
// from the working tree: the release in the making (its tag sdk/go/v0.2.0 once cut).
const goSDKRelease = "v0.2.0"

// genModule is the generated types' module, which sdk/go requires at the version its go.mod names
// (genRelease).
const genModule = "github.com/integrations-platform/integrations/pkg/gen"

// The modules a Go adapter or client outside this repository requires, and where they live here.
var publishedModules = map[string]string{
	sdkModule: "../sdk/go",
	genModule: "../pkg/gen",
}

// forbiddenInSDKGraph are the module paths (and those below them) an adapter must not be made to depend on:
// the platform's database, broker and migration libraries, its trace exporters, and the
// platform's own module.
var forbiddenInSDKGraph = []string{
	"github.com/jackc/pgx",
	"github.com/rabbitmq/amqp091-go",
	"github.com/pressly/goose",
	"go.opentelemetry.io/otel/exporters",
	"github.com/integrations-platform/integrations/pkg",
	"github.com/integrations-platform/integrations/migrations",
}

// outsideAdapter is an adapter program in a module of its own, as an adapter author writes one
// after `go get github.com/integrations-platform/integrations/sdk/go`.
const outsideAdapter = `package main

import (
	"context"
	"fmt"
	"net"
	"os"

	"google.golang.org/grpc"

	"github.com/integrations-platform/integrations/sdk/go/adapter"
	"github.com/integrations-platform/integrations/sdk/go/platformtoken"
)

func main() {
	keys, err := platformtoken.ParsePublicKeys(os.Getenv("PLATFORM_KEYS"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	ad, err := adapter.New(func(ctx context.Context, req *adapter.Request) adapter.Result {
		return adapter.Complete(map[string]any{"echo": req.Payload})
	}, adapter.Options{AdapterID: "outside", PlatformKeys: keys, InsecureSkipPlatformAuth: len(keys) == 0})
	if err != nil {
		panic(err)
	}
	srv := grpc.NewServer()
	ad.Register(srv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	fmt.Println("serving on", lis.Addr())
	_ = lis.Close()
}
`

// outsideClient is a client application's use of the same module, in the same outside module:
// the client SDK and the webhook helper, compiled with the adapter (its graph is the module's),
// and what they read of pkg/gen since v0.1.0 (typed event data, ErrorReason).
const outsideClient = `package main

import (
	"github.com/integrations-platform/integrations/sdk/go/client"
	"github.com/integrations-platform/integrations/sdk/go/rpcstatus"
	"github.com/integrations-platform/integrations/sdk/go/webhooks"
)

var (
	_ = client.New
	_ = client.CompletedData
	_ = rpcstatus.ErrorReason
	_ = webhooks.Verifier{}
)
`

// TestGoSDKOutsideTheWorkspace builds an adapter (and a client: outsideClient) in a module outside this repository's workspace
// (GOWORK=off) that requires the Go SDK with a plain require, served from a module proxy that
// holds the SDK and the generated types as the release tags publish them (module zips made from
// sdk/go and pkg/gen): sdk/go's go.mod must stand on its own (its replace of pkg/gen is ignored
// outside, as Go ignores a dependency's replaces), and the module graph the adapter gets holds
// none of the platform's database, broker, migration or exporter libraries.
//
// pkg/gen is published at the version sdk/go's go.mod requires (genRelease): from its tag when
// the repository has one, so that an SDK that came to need a change made since fails here as it
// would for its users; from the working tree when that version is not tagged yet — the next
// release, which the require names once the SDK needs a change of pkg/gen not yet released.
func TestGoSDKOutsideTheWorkspace(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module from scratch")
	}
	goBin, err := exec.LookPath("go")
	require.NoError(t, err, "the go command")
	proxy := t.TempDir()
	gen := genRelease(t)
	versions := map[string]string{sdkModule: goSDKRelease, genModule: gen}
	for path, dir := range publishedModules {
		publish(t, proxy, path, dir, versions[path])
	}

	work := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(work, "go.mod"), []byte("module example.com/outside\n\ngo 1.26.0\n\n"+
		"require github.com/integrations-platform/integrations/sdk/go "+goSDKRelease+"\n"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(work, "main.go"), []byte(outsideAdapter), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(work, "client.go"), []byte(outsideClient), 0o600))

	// A module cache of its own, so that no release made here stays in the machine's cache (the
	// next run must fetch what the proxy holds then); every other module is read from the
	// machine's cache as a proxy (its cache/download directory has a proxy's layout), never from
	// the network: GOPROXY=off on the offline path.
	cache, err := exec.Command(goBin, "env", "GOMODCACHE").Output()
	require.NoError(t, err)
	env := append(os.Environ(),
		"GOWORK=off",
		"GOMODCACHE="+filepath.Join(t.TempDir(), "mod"),
		"GOPROXY=file://"+filepath.ToSlash(proxy)+",file://"+filepath.ToSlash(filepath.Join(strings.TrimSpace(string(cache)), "cache", "download")),
		"GOSUMDB=off", "GOFLAGS=-mod=mod -modcacherw", "GOTOOLCHAIN=local",
	)
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(goBin, args...)
		cmd.Dir, cmd.Env = work, env
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "go %s:\n%s", strings.Join(args, " "), out)
		return string(out)
	}
	run("mod", "tidy")
	run("build", "-o", filepath.Join(work, "adapter"), ".")
	_, err = os.Stat(filepath.Join(work, "adapter"))
	require.NoError(t, err, "the adapter was built")

	// The whole module graph (go mod graph: every requirement of every module reached, not only
	// those the build selected).
	graph := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(run("mod", "graph")), "\n") {
		for _, node := range strings.Fields(line) {
			graph[node] = true
		}
	}
	require.True(t, graph["github.com/integrations-platform/integrations/sdk/go@"+goSDKRelease], "%v", graph)
	require.True(t, graph[genModule+"@"+gen], "%v", graph)
	for node := range graph {
		path, _, _ := strings.Cut(node, "@")
		for _, bad := range forbiddenInSDKGraph {
			below := strings.HasPrefix(path, bad+"/") && !publishedModule(path)
			require.False(t, path == bad || below, "%s in the adapter's module graph", node)
		}
	}
	t.Logf("the adapter's module graph: %d modules and versions", len(graph))
}

// sdkModule is the module the test builds as it is now.
const sdkModule = "github.com/integrations-platform/integrations/sdk/go"

// genRelease is the version of pkg/gen that sdk/go's go.mod requires.
func genRelease(t *testing.T) string {
	t.Helper()
	path := filepath.Join(publishedModules[sdkModule], "go.mod")
	text, err := os.ReadFile(path)
	require.NoError(t, err)
	f, err := modfile.ParseLax(path, text, nil)
	require.NoError(t, err)
	for _, r := range f.Require {
		if r.Mod.Path == genModule {
			return r.Mod.Version
		}
	}
	require.FailNow(t, "sdk/go's go.mod does not require "+genModule)
	return ""
}

// releaseTag answers the tag that releases the module at dir as version (pkg/gen/v0.2.0 for
// ../pkg/gen) when the repository has it.
func releaseTag(t *testing.T, dir, version string) (string, bool) {
	t.Helper()
	tag := strings.TrimPrefix(dir, "../") + "/" + version
	err := exec.Command("git", "-C", "..", "rev-parse", "-q", "--verify", "refs/tags/"+tag).Run()
	return tag, err == nil
}

func publishedModule(path string) bool { _, ok := publishedModules[path]; return ok }

// publish puts the module at dir into the file proxy at proxy as version: its zip (made by
// golang.org/x/mod/zip, as the Go module mirror makes one from a tag), go.mod and info.
func publish(t *testing.T, proxy, path, dir, version string) {
	t.Helper()
	escaped, err := module.EscapePath(path)
	require.NoError(t, err)
	at := filepath.Join(proxy, filepath.FromSlash(escaped), "@v")
	require.NoError(t, os.MkdirAll(at, 0o755))
	v := module.Version{Path: path, Version: version}
	zf, err := os.Create(filepath.Join(at, version+".zip"))
	require.NoError(t, err)
	var mod []byte
	if tag, ok := releaseTag(t, dir, version); ok && dir != publishedModules[sdkModule] {
		// What sdk/go requires is released: the module as the tag has it, not the working tree,
		// so that an SDK that came to need a change made since fails here as it would for users.
		require.NoError(t, modzip.CreateFromVCS(zf, v, "..", tag, strings.TrimPrefix(dir, "../")), "module zip of %s at %s", dir, tag)
		out, err := exec.Command("git", "-C", "..", "show", tag+":"+strings.TrimPrefix(dir, "../")+"/go.mod").Output()
		require.NoError(t, err)
		mod = out
		t.Logf("%s from the tag %s", path, tag)
	} else {
		// The SDK itself, as it is now (and what it requires, before that version's tag).
		require.NoError(t, modzip.CreateFromDir(zf, v, dir), "module zip of %s", dir)
		mod, err = os.ReadFile(filepath.Join(dir, "go.mod"))
		require.NoError(t, err)
	}
	require.NoError(t, zf.Close())
	require.NoError(t, os.WriteFile(filepath.Join(at, version+".mod"), mod, 0o600))
	info, err := json.Marshal(map[string]string{"Version": version, "Time": time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC).Format(time.RFC3339)})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(at, version+".info"), info, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(at, "list"), []byte(version+"\n"), 0o600))
}
