package check

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

// mutate returns a copy of docs with the object kind/name changed by f (on its content as a map).
func mutate(t *testing.T, docs []Doc, kind, name string, f func(m map[string]any)) []Doc {
	t.Helper()
	out := make([]Doc, len(docs))
	found := false
	for i, d := range docs {
		var m map[string]any
		require.NoError(t, yaml.Unmarshal(d.YAML, &m))
		meta, _ := m["metadata"].(map[string]any)
		if m["kind"] != kind || meta["name"] != name {
			out[i] = d
			continue
		}
		found = true
		f(m)
		y, err := yaml.Marshal(m)
		require.NoError(t, err)
		out[i] = Doc{YAML: y}
	}
	require.True(t, found, "fixture has no %s %s", kind, name)
	return out
}

// at walks a path of map keys and list indexes to a map inside m.
func at(t *testing.T, m map[string]any, path ...any) map[string]any {
	t.Helper()
	var cur any = m
	for _, p := range path {
		switch k := p.(type) {
		case string:
			mm, ok := cur.(map[string]any)
			require.True(t, ok, "%v: not a map at %q", path, k)
			cur = mm[k]
		case int:
			l, ok := cur.([]any)
			require.True(t, ok, "%v: not a list at %d", path, k)
			cur = l[k]
		}
	}
	mm, ok := cur.(map[string]any)
	require.True(t, ok, "%v: not a map", path)
	return mm
}

// TestChecksFailWhenBroken breaks the passing fixture one way at a time and asserts that the
// checks fail with a message naming the object (and the field or variable at fault).
func TestChecksFailWhenBroken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	docs, err := Render(fixtureDir(b))
	require.NoError(t, err)
	opts := b.options(t, fixtureDir(b), false)

	const dep = "Deployment/integrations/dispatcher"
	container := []any{"spec", "template", "spec", "containers", 0}
	onDeployment := func(f func(t *testing.T, m map[string]any)) func(t *testing.T) []Doc {
		return func(t *testing.T) []Doc {
			return mutate(t, docs, "Deployment", "dispatcher", func(m map[string]any) { f(t, m) })
		}
	}
	onObject := func(kind, name string, f func(t *testing.T, m map[string]any)) func(t *testing.T) []Doc {
		return func(t *testing.T) []Doc {
			return mutate(t, docs, kind, name, func(m map[string]any) { f(t, m) })
		}
	}
	cases := []struct {
		name    string
		breakIt func(t *testing.T) []Doc
		want    string
	}{
		// Strict decoding of built-ins.
		{"unknown field in a Deployment", onDeployment(func(t *testing.T, m map[string]any) {
			at(t, m, container...)["imagePullPolice"] = "Always"
		}), dep + `: unknown field "spec.template.spec.containers[0].imagePullPolice"`},
		{"duplicate field in a Deployment", func(t *testing.T) []Doc {
			out := append([]Doc(nil), docs...)
			for i, d := range out {
				if bytes.Contains(d.YAML, []byte("kind: Deployment")) {
					out[i] = Doc{YAML: bytes.Replace(d.YAML, []byte("\nspec:\n"), []byte("\nspec:\n  replicas: 3\n"), 1)}
				}
			}
			return out
		}, dep + `: duplicate field: yaml: unmarshal errors: line 10: key "replicas" already set in map`},
		// Custom resources against their CRDs.
		{"unknown field in a Cluster", onObject("Cluster", "pg", func(t *testing.T, m map[string]any) {
			at(t, m, "spec")["instancez"] = 3
		}), `Cluster/integrations/pg: unknown field "spec.instancez"`},
		{"unknown metadata field in a Cluster", onObject("Cluster", "pg", func(t *testing.T, m map[string]any) {
			at(t, m, "metadata")["labelz"] = map[string]any{"a": "b"}
		}), `Cluster/integrations/pg: unknown field "metadata.labelz"`},
		{"wrong type in a Cluster", onObject("Cluster", "pg", func(t *testing.T, m map[string]any) {
			at(t, m, "spec")["instances"] = "three"
		}), `Cluster/integrations/pg: spec.instances: Invalid value`},
		{"a Cluster's CEL rule", onObject("Cluster", "pg", func(t *testing.T, m map[string]any) {
			initdb := at(t, m, "spec", "bootstrap", "initdb")
			initdb["builtinLocale"], initdb["localeProvider"] = "C", "icu"
		}), `Cluster/integrations/pg: spec.bootstrap.initdb: Invalid value: builtinLocale is only available when localeProvider is set to ` + "`builtin`" + ` (postgresql.cnpg.io_clusters.yaml, CEL rule)`},
		{"unknown field in a Pooler", onObject("Pooler", "pg-pooler", func(t *testing.T, m map[string]any) {
			at(t, m, "spec", "pgbouncer")["poolmode"] = "session"
		}), `Pooler/integrations/pg-pooler: unknown field "spec.pgbouncer.poolmode"`},
		{"unknown field in a RabbitmqCluster", onObject("RabbitmqCluster", "rabbitmq", func(t *testing.T, m map[string]any) {
			at(t, m, "spec")["replica"] = 3
		}), `RabbitmqCluster/integrations/rabbitmq: unknown field "spec.replica"`},
		{"unknown field in a ServiceMonitor", onObject("ServiceMonitor", "dispatcher", func(t *testing.T, m map[string]any) {
			at(t, m, "spec", "endpoints", 0)["intervall"] = "30s"
		}), `ServiceMonitor/integrations/dispatcher: unknown field "spec.endpoints[0].intervall"`},
		{"a PrometheusRule without expr", onObject("PrometheusRule", "integrations", func(t *testing.T, m map[string]any) {
			delete(at(t, m, "spec", "groups", 0, "rules", 0), "expr")
		}), `PrometheusRule/integrations/integrations: spec.groups[0].rules[0].expr: Required value`},
		{"unknown field in a Certificate", onObject("Certificate", "dispatcher-tls", func(t *testing.T, m map[string]any) {
			at(t, m, "spec")["uri"] = "spiffe://integrations/dispatcher"
		}), `Certificate/integrations/dispatcher-tls: unknown field "spec.uri"`},
		{"a custom resource no CRD serves", onObject("Pooler", "pg-pooler", func(t *testing.T, m map[string]any) {
			m["apiVersion"] = "postgresql.cnpg.io/v2"
		}), `Pooler/integrations/pg-pooler: no CRD serves postgresql.cnpg.io/v2, Kind=Pooler`},
		// Deployment properties.
		{"no readiness probe", onDeployment(func(t *testing.T, m map[string]any) {
			delete(at(t, m, container...), "readinessProbe")
		}), dep + ": container dispatcher: no readinessProbe"},
		{"no liveness probe", onDeployment(func(t *testing.T, m map[string]any) {
			delete(at(t, m, container...), "livenessProbe")
		}), dep + ": container dispatcher: no livenessProbe"},
		{"no startup probe", onDeployment(func(t *testing.T, m map[string]any) {
			delete(at(t, m, container...), "startupProbe")
		}), dep + ": container dispatcher: no startupProbe"},
		{"no memory limit", onDeployment(func(t *testing.T, m map[string]any) {
			delete(at(t, m, append(container, "resources")...), "limits")
		}), dep + ": container dispatcher: no resources.limits.memory"},
		{"no cpu request", onDeployment(func(t *testing.T, m map[string]any) {
			delete(at(t, m, append(container, "resources", "requests")...), "cpu")
		}), dep + ": container dispatcher: no resources.requests.cpu"},
		{"root allowed", onDeployment(func(t *testing.T, m map[string]any) {
			delete(at(t, m, "spec", "template", "spec", "securityContext"), "runAsNonRoot")
		}), dep + ": container dispatcher: securityContext.runAsNonRoot is not true"},
		{"writable root filesystem", onDeployment(func(t *testing.T, m map[string]any) {
			at(t, m, append(container, "securityContext")...)["readOnlyRootFilesystem"] = false
		}), dep + ": container dispatcher: securityContext.readOnlyRootFilesystem is not true"},
		{"privilege escalation", onDeployment(func(t *testing.T, m map[string]any) {
			delete(at(t, m, append(container, "securityContext")...), "allowPrivilegeEscalation")
		}), dep + ": container dispatcher: securityContext.allowPrivilegeEscalation is not false"},
		{"capabilities kept", onDeployment(func(t *testing.T, m map[string]any) {
			at(t, m, append(container, "securityContext", "capabilities")...)["drop"] = []any{"NET_RAW"}
		}), dep + ": container dispatcher: securityContext.capabilities.drop does not include ALL"},
		{"grace period not above the shutdown timeout", onDeployment(func(t *testing.T, m map[string]any) {
			at(t, m, "spec", "template", "spec")["terminationGracePeriodSeconds"] = 20
		}), dep + ": terminationGracePeriodSeconds 20 is not longer than container dispatcher's INTEGRATIONS_SHUTDOWN_TIMEOUT 20s"},
		{"shutdown timeout from a Secret", onDeployment(func(t *testing.T, m map[string]any) {
			c := at(t, m, container...)
			c["env"] = append(c["env"].([]any), map[string]any{"name": "INTEGRATIONS_SHUTDOWN_TIMEOUT",
				"valueFrom": map[string]any{"secretKeyRef": map[string]any{"name": "s", "key": "k"}}})
		}), dep + ": container dispatcher: INTEGRATIONS_SHUTDOWN_TIMEOUT comes from Secret s"},
		// The service's variables.
		{"a variable dropped from the ConfigMap", onObject("ConfigMap", "dispatcher-config", func(t *testing.T, m map[string]any) {
			delete(at(t, m, "data"), "INTEGRATIONS_DISPATCH_BATCH_SIZE")
		}), dep + ": container dispatcher: INTEGRATIONS_DISPATCH_BATCH_SIZE (config.Config.BatchSize, read by services/dispatcher) is not set"},
		{"a variable dropped from env", onDeployment(func(t *testing.T, m map[string]any) {
			c := at(t, m, container...)
			c["env"] = c["env"].([]any)[1:]
		}), dep + ": container dispatcher: INTEGRATIONS_DATABASE_URL (config.Common.DatabaseURL, read by services/dispatcher) is not set"},
		{"envFrom a ConfigMap not rendered", onDeployment(func(t *testing.T, m map[string]any) {
			at(t, m, append(container, "envFrom", 0, "configMapRef")...)["name"] = "nowhere"
		}), dep + ": container dispatcher: envFrom ConfigMap nowhere is not in the rendered output"},
		{"a ConfigMap key not rendered", onDeployment(func(t *testing.T, m map[string]any) {
			at(t, m, append(container, "env", 2, "valueFrom", "configMapKeyRef")...)["key"] = "NOPE"
		}), dep + ": container dispatcher: INTEGRATIONS_DISPATCH_RECOVER_INTERVAL: ConfigMap key dispatcher-config/NOPE is not in the rendered output"},
		// Selectors.
		{"a Service selecting nothing", onObject("Service", "dispatcher", func(t *testing.T, m map[string]any) {
			at(t, m, "spec", "selector")["app.kubernetes.io/name"] = "dispatchr"
		}), "Service/integrations/dispatcher: selector app.kubernetes.io/name=dispatchr selects no pods"},
		{"a Service's targetPort missing", onObject("Service", "dispatcher", func(t *testing.T, m map[string]any) {
			at(t, m, "spec", "ports", 0)["targetPort"] = "grpcs"
		}), "Service/integrations/dispatcher: port grpc: targetPort grpcs is not a container port"},
		{"a NetworkPolicy selecting nothing", onObject("NetworkPolicy", "dispatcher", func(t *testing.T, m map[string]any) {
			at(t, m, "spec", "podSelector", "matchLabels")["app.kubernetes.io/name"] = "dispatchr"
		}), "NetworkPolicy/integrations/dispatcher: podSelector app.kubernetes.io/name=dispatchr selects no pods"},
		{"a NetworkPolicy peer that does not exist", onObject("NetworkPolicy", "dispatcher", func(t *testing.T, m map[string]any) {
			at(t, m, "spec", "egress", 0, "to", 0, "podSelector", "matchLabels")["cnpg.io/cluster"] = "postgres"
		}), "NetworkPolicy/integrations/dispatcher: egress[0] peer 0: podSelector cnpg.io/cluster=postgres selects no pods"},
		{"a NetworkPolicy ingress port the pods lack", onObject("NetworkPolicy", "dispatcher", func(t *testing.T, m map[string]any) {
			at(t, m, "spec", "ingress", 1, "ports", 0)["port"] = 9999
		}), "NetworkPolicy/integrations/dispatcher: ingress[1]: port 9999 is not a container port of the selected pods"},
		{"a NetworkPolicy egress port the peers lack", onObject("NetworkPolicy", "dispatcher", func(t *testing.T, m map[string]any) {
			at(t, m, "spec", "egress", 1, "ports", 0)["port"] = 5673
		}), "NetworkPolicy/integrations/dispatcher: egress[1]: port 5673 is not a container port of the peers"},
		{"a workload no NetworkPolicy isolates for egress", onObject("NetworkPolicy", "dispatcher", func(t *testing.T, m map[string]any) {
			spec := at(t, m, "spec")
			spec["policyTypes"] = []any{"Ingress"}
			delete(spec, "egress")
		}), dep + ": no NetworkPolicy selects its pods for Egress (all egress is open)"},
		{"a ServiceMonitor selecting no Service", onObject("ServiceMonitor", "dispatcher", func(t *testing.T, m map[string]any) {
			at(t, m, "spec", "selector", "matchLabels")["app.kubernetes.io/name"] = "gateway"
		}), "ServiceMonitor/integrations/dispatcher: selector app.kubernetes.io/name=gateway selects no Service"},
		{"a ServiceMonitor looking in another namespace", onObject("ServiceMonitor", "dispatcher", func(t *testing.T, m map[string]any) {
			at(t, m, "spec")["namespaceSelector"] = map[string]any{"matchNames": []any{"elsewhere"}}
		}), "ServiceMonitor/integrations/dispatcher: selector app.kubernetes.io/name=dispatcher selects no Service"},
		{"a ServiceMonitor port the Service lacks", onObject("ServiceMonitor", "dispatcher", func(t *testing.T, m map[string]any) {
			at(t, m, "spec", "endpoints", 0)["port"] = "http-metrics"
		}), `ServiceMonitor/integrations/dispatcher: endpoints[0]: no selected Service has a port named "http-metrics"`},
		{"a PodDisruptionBudget selecting nothing", onObject("PodDisruptionBudget", "dispatcher", func(t *testing.T, m map[string]any) {
			at(t, m, "spec", "selector", "matchLabels")["app.kubernetes.io/name"] = "dispatchr"
		}), "PodDisruptionBudget/integrations/dispatcher: selector app.kubernetes.io/name=dispatchr selects no pods"},
		{"an HPA scaling nothing", onObject("HorizontalPodAutoscaler", "dispatcher", func(t *testing.T, m map[string]any) {
			at(t, m, "spec", "scaleTargetRef")["name"] = "dispatchr"
		}), "HorizontalPodAutoscaler/integrations/dispatcher: scaleTargetRef Deployment/dispatchr is not in the rendered output"},
		// One image.
		{"a container on another image", onDeployment(func(t *testing.T, m map[string]any) {
			at(t, m, container...)["image"] = "integrations:latest"
		}), dep + `: container dispatcher: image "integrations:latest" is not the overlay's "integrations:0123abc"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, errs := Check(tc.breakIt(t), opts)
			require.NotEmpty(t, errs, "the broken fixture passed")
			for _, e := range errs {
				if strings.Contains(e, tc.want) {
					t.Log(e) // the message a reader of `go test -v` sees for this break
					return
				}
			}
			t.Fatalf("no failure contains %q; got:\n  %s", tc.want, joinErrs(errs))
		})
	}
}

// TestDuplicateKeyInSourceFails: kustomize keeps a source file's duplicate key to the output,
// where rendering refuses it, naming the object and the key.
func TestDuplicateKeyInSourceFails(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte("resources:\n  - cm.yaml\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "cm.yaml"), []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: dup\ndata:\n  a: \"1\"\n  a: \"2\"\n"), 0o644))
	_, err := Render(dir)
	require.Error(t, err)
	require.Contains(t, err.Error(), "ConfigMap.v1.[noGrp]/dup")
	require.Contains(t, err.Error(), `mapping key "a" already defined`)
}

// TestImageSetOnce: a tag set below the overlay too is a second place, and an overlay without
// one sets none.
func TestImageSetOnce(t *testing.T) {
	t.Parallel()
	write := func(t *testing.T, dir, text string) {
		t.Helper()
		require.NoError(t, os.MkdirAll(dir, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(text), 0o644))
	}
	root := t.TempDir()
	base, overlay := filepath.Join(root, "base"), filepath.Join(root, "overlay")
	write(t, base, "images:\n  - name: integrations\n    newTag: old\n")
	write(t, overlay, "resources:\n  - ../base\nimages:\n  - name: integrations\n    newName: registry.example/integrations\n    newTag: abc\n")
	ref, errs := ImageSetting(overlay)
	require.Equal(t, "registry.example/integrations:abc", ref)
	require.Len(t, errs, 1)
	require.Contains(t, errs[0], base+"/kustomization.yaml sets image integrations too")

	write(t, base, "resources: []\n")
	write(t, overlay, "resources:\n  - ../base\n")
	_, errs = ImageSetting(overlay)
	require.Len(t, errs, 1)
	require.True(t, strings.HasSuffix(errs[0], "has no images entry for integrations: the overlay sets the tag"), errs[0])
}
