package check

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The flows derived from the prod overlay are the architecture's (so a pass is not vacuous), and
// a policy that stops one fails, naming the workload, the variable and the policy.
func TestProdFlows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dir := filepath.Join(b.root, "deploy", "k8s", "overlays", "prod")
	if _, err := os.Stat(filepath.Join(dir, "kustomization.yaml")); err != nil {
		t.Fatalf("overlay %s is missing: %v", dir, err)
	}
	docs, err := Render(dir)
	require.NoError(t, err)
	objs, _ := Decode(docs)
	flows, errs := requiredFlows(objs, RenderedConfigMaps(objs))
	require.Empty(t, errs)
	seen := map[string]bool{}
	for _, f := range flows {
		seen[f.from.Owner+" → "+f.to.Owner] = true
	}
	for _, want := range []string{
		"Deployment/integrations/gateway → Deployment/integrations/settlement",
		"Deployment/integrations/gateway → Deployment/integrations/dispatcher",
		"Deployment/integrations/execution-consumer → Deployment/integrations/settlement",
		"Deployment/integrations/execution-consumer → Deployment/integrations/dispatcher",
		"Deployment/integrations/settlement → Deployment/integrations/dispatcher",
		"Deployment/integrations/adapter-callback → Deployment/integrations/settlement",
		"Deployment/integrations/gateway → Pooler/integrations/integrations-pg-pooler-rw",
		"Deployment/integrations/event-router → Cluster/integrations/integrations-pg",
		"Deployment/integrations/dispatcher → RabbitmqCluster/integrations/integrations-rabbitmq",
		"Job/integrations/integrations-migrate → Cluster/integrations/integrations-pg",
	} {
		require.True(t, seen[want], "flow %s not derived; derived: %v", want, keys(seen))
	}
	require.Empty(t, Flows(objs, RenderedConfigMaps(objs), AllPods(objs)))

	// The dispatcher's policy no longer admits settlement.
	broken := mutate(t, docs, "NetworkPolicy", "dispatcher", func(m map[string]any) {
		ingress := at(t, m, "spec")["ingress"].([]any)
		for _, r := range ingress {
			rule := r.(map[string]any)
			var kept []any
			for _, p := range rule["from"].([]any) {
				if !strings.Contains(toString(p), "settlement") {
					kept = append(kept, p)
				}
			}
			rule["from"] = kept
		}
	})
	objs, _ = Decode(broken)
	got := joinErrs(Flows(objs, RenderedConfigMaps(objs), AllPods(objs)))
	// The message names every policy selecting the target (the default deny among them).
	require.Contains(t, got, "Deployment/integrations/settlement: container settlement: INTEGRATIONS_DISPATCHER_ADDR=dispatcher:9091: no ingress rule of ")
	require.Contains(t, got, "NetworkPolicy/integrations/dispatcher lets it into Deployment/integrations/dispatcher on port 9091")
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func toString(v any) string {
	var b strings.Builder
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				b.WriteString(k + "=")
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		case string:
			b.WriteString(v + ";")
		}
	}
	walk(v)
	return b.String()
}
