package check

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// Overlays are the overlays `kubectl apply -k` is documented for; each must render and pass.
var Overlays = []string{"dev", "prod"}

type bundle struct {
	root    string
	schemas Schemas
	vars    map[string][]Var
}

var (
	bundleOnce sync.Once
	shared     bundle
	sharedErr  error
)

// setup loads what every test shares (the CRDs take a moment to compile) once.
func setup(t *testing.T) bundle {
	t.Helper()
	bundleOnce.Do(func() {
		shared.root, sharedErr = RepoRoot(".")
		if sharedErr != nil {
			return
		}
		shared.schemas, sharedErr = LoadCRDs(filepath.Join(shared.root, "third_party", "crds"))
		if sharedErr != nil {
			return
		}
		shared.vars = map[string][]Var{}
		for _, s := range Services {
			shared.vars[s], sharedErr = ConfigVars(shared.root, s)
			if sharedErr != nil {
				return
			}
		}
	})
	require.NoError(t, sharedErr)
	return shared
}

func (b bundle) options(t *testing.T, dir string, all bool) Options {
	t.Helper()
	ref, errs := ImageSetting(dir)
	require.Empty(t, errs, "image setting of %s", dir)
	return Options{Schemas: b.schemas, Vars: b.vars, Image: ref, AllServices: all}
}

func fixtureDir(b bundle) string {
	return filepath.Join(b.root, "deploy", "k8s", "check", "testdata", "fixture")
}

func TestFixturePasses(t *testing.T) {
	t.Parallel()
	b := setup(t)
	docs, err := Render(fixtureDir(b))
	require.NoError(t, err)
	objs, errs := Check(docs, b.options(t, fixtureDir(b), false))
	require.Empty(t, errs, "the fixture is meant to pass every check:\n  %s", joinErrs(errs))
	// Every check family must have had something to look at, or a pass says nothing.
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.GVK.Kind]++
	}
	for _, k := range []string{"Deployment", "Service", "NetworkPolicy", "ConfigMap", "Cluster", "Pooler", "RabbitmqCluster", "ServiceMonitor", "PrometheusRule", "Certificate", "Issuer", "PodDisruptionBudget", "HorizontalPodAutoscaler"} {
		require.Positive(t, kinds[k], "fixture has no %s", k)
	}
}

// TestOverlays renders each real overlay and runs every check on it.
func TestOverlays(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, name := range Overlays {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dir := filepath.Join(b.root, "deploy", "k8s", "overlays", name)
			if _, err := os.Stat(filepath.Join(dir, "kustomization.yaml")); err != nil {
				t.Fatalf("overlay %s is missing: %v (issue 12 deploys with kubectl apply -k deploy/k8s/overlays/%s)", dir, err, name)
			}
			docs, err := Render(dir)
			require.NoError(t, err)
			// The image setting's failures are reported with the rest, not instead of them.
			ref, imageErrs := ImageSetting(dir)
			_, errs := Check(docs, Options{Schemas: b.schemas, Vars: b.vars, Image: ref, AllServices: true})
			errs = append(imageErrs, errs...)
			if len(errs) > 0 {
				t.Errorf("overlay %s: %d failures:\n  %s", name, len(errs), joinErrs(errs))
			}
		})
	}
}

// TestProdCounts prints the rendered prod overlay by kind and asserts what issue 12 promises.
func TestProdCounts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dir := filepath.Join(b.root, "deploy", "k8s", "overlays", "prod")
	if _, err := os.Stat(filepath.Join(dir, "kustomization.yaml")); err != nil {
		t.Fatalf("overlay %s is missing: %v", dir, err)
	}
	docs, err := Render(dir)
	require.NoError(t, err)
	objs, _ := Decode(docs)
	counts := map[string]int{}
	for _, o := range objs {
		counts[o.GVK.Kind]++
	}
	kinds := make([]string, 0, len(counts))
	for k := range counts {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	var table strings.Builder
	table.WriteString("rendered prod overlay:\n")
	for _, k := range kinds {
		fmt.Fprintf(&table, "  %-26s %d\n", k, counts[k])
	}
	t.Log(table.String())

	for _, want := range []struct {
		kind     string
		min, max int // max 0: no upper bound
	}{
		{"Deployment", 6, 6},
		{"Service", 6, 0},
		{"PodDisruptionBudget", 1, 0},
		{"HorizontalPodAutoscaler", 2, 2},
		{"NetworkPolicy", 1, 0},
		{"Job", 1, 1},
		{"Cluster", 1, 1},
		{"Pooler", 1, 1},
		{"RabbitmqCluster", 1, 1},
		{"ServiceMonitor", 6, 0}, // one per service
		{"PrometheusRule", 1, 1},
	} {
		got := counts[want.kind]
		switch {
		case want.max > 0 && want.min == want.max && got != want.min:
			t.Errorf("prod overlay: %d %s, want %d", got, want.kind, want.min)
		case want.max > 0 && (got < want.min || got > want.max):
			t.Errorf("prod overlay: %d %s, want %d to %d", got, want.kind, want.min, want.max)
		case got < want.min:
			t.Errorf("prod overlay: %d %s, want at least %d", got, want.kind, want.min)
		}
	}
}
