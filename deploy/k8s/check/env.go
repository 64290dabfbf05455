package check

import (
	"fmt"
	"path/filepath"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// ConfigMaps are the rendered ConfigMaps' data, by namespace/name.
type ConfigMaps map[string]map[string]string

// RenderedConfigMaps collects the ConfigMaps of the rendered output.
func RenderedConfigMaps(objs []Object) ConfigMaps {
	cms := ConfigMaps{}
	for _, o := range objs {
		if cm, ok := o.Typed.(*corev1.ConfigMap); ok {
			data := map[string]string{}
			for k, v := range cm.Data {
				data[k] = v
			}
			cms[o.Namespace+"/"+o.Name] = data
		}
	}
	return cms
}

// envValue is how a container gets one variable: a literal or a ConfigMap key (known, with its
// value) or a Secret key or field reference (set, but not knowable offline).
type envValue struct {
	value string
	known bool
	from  string
}

// containerEnv resolves the variables a container is given, as the kubelet does: envFrom first,
// env on top. A ConfigMap a container refers to must be in the rendered output (unless
// optional) — else the pod would not start; the failures say which. Keys of an envFrom Secret
// cannot be known offline, so they set nothing here: give a service's secrets with
// env[].valueFrom.secretKeyRef, which names each key.
func containerEnv(o Object, c *corev1.Container, cms ConfigMaps) (map[string]envValue, []string) {
	env := map[string]envValue{}
	var errs []string
	fail := func(format string, args ...any) {
		errs = append(errs, fmt.Sprintf("%s: container %s: %s", o.ID(), c.Name, fmt.Sprintf(format, args...)))
	}
	for _, ef := range c.EnvFrom {
		if ef.ConfigMapRef == nil {
			continue
		}
		data, ok := cms[o.Namespace+"/"+ef.ConfigMapRef.Name]
		if !ok {
			if ef.ConfigMapRef.Optional == nil || !*ef.ConfigMapRef.Optional {
				fail("envFrom ConfigMap %s is not in the rendered output", ef.ConfigMapRef.Name)
			}
			continue
		}
		for k, v := range data {
			env[ef.Prefix+k] = envValue{value: v, known: true, from: "ConfigMap " + ef.ConfigMapRef.Name}
		}
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = envValue{value: e.Value, known: true, from: "env"}
		case e.ValueFrom.ConfigMapKeyRef != nil:
			ref := e.ValueFrom.ConfigMapKeyRef
			v, ok := cms[o.Namespace+"/"+ref.Name][ref.Key]
			if !ok {
				if ref.Optional == nil || !*ref.Optional {
					fail("%s: ConfigMap key %s/%s is not in the rendered output", e.Name, ref.Name, ref.Key)
				}
				continue
			}
			env[e.Name] = envValue{value: v, known: true, from: "ConfigMap " + ref.Name}
		case e.ValueFrom.SecretKeyRef != nil:
			env[e.Name] = envValue{from: "Secret " + e.ValueFrom.SecretKeyRef.Name}
		default:
			env[e.Name] = envValue{from: "a field reference"}
		}
	}
	return env, errs
}

// ServiceOf says which of the platform's services a Deployment runs, or "" for another workload
// (the dev overlay's dummy adapter and demo consumer): by the app.kubernetes.io/name or
// app.kubernetes.io/component label, else the name (a namePrefix or nameSuffix may surround it).
func ServiceOf(d *appsv1.Deployment) string {
	for _, l := range []string{"app.kubernetes.io/name", "app.kubernetes.io/component"} {
		for _, s := range Services {
			if d.Spec.Template.Labels[l] == s {
				return s
			}
		}
	}
	for _, s := range Services {
		if d.Name == s || strings.HasSuffix(d.Name, "-"+s) || strings.HasPrefix(d.Name, s+"-") {
			return s
		}
	}
	return ""
}

// serviceContainer is the container running the service: the one whose command is the
// service's binary, else the one named after it, else the only one.
func serviceContainer(spec *corev1.PodSpec, service string) *corev1.Container {
	for i := range spec.Containers {
		if cmd := spec.Containers[i].Command; len(cmd) > 0 && filepath.Base(cmd[0]) == service {
			return &spec.Containers[i]
		}
	}
	for i := range spec.Containers {
		if spec.Containers[i].Name == service {
			return &spec.Containers[i]
		}
	}
	if len(spec.Containers) == 1 {
		return &spec.Containers[0]
	}
	return nil
}

// Env asserts that each service's Deployment sets every variable its configuration reads
// (vars, from ConfigVars), from env or a rendered ConfigMap, so that no setting falls back to a
// development default (127.0.0.1 addresses, guest credentials) in a cluster. With
// requireAll, each of the six services must have a Deployment.
func Env(objs []Object, cms ConfigMaps, vars map[string][]Var, requireAll bool) []string {
	var errs []string
	seen := map[string]bool{}
	for _, o := range objs {
		d, ok := o.Typed.(*appsv1.Deployment)
		if !ok {
			continue
		}
		svc := ServiceOf(d)
		if svc == "" {
			continue
		}
		seen[svc] = true
		c := serviceContainer(&d.Spec.Template.Spec, svc)
		if c == nil {
			errs = append(errs, fmt.Sprintf("%s: no container runs %s (none has command %s or name %s)", o.ID(), svc, svc, svc))
			continue
		}
		env, refErrs := containerEnv(o, c, cms)
		errs = append(errs, refErrs...)
		for _, v := range vars[svc] {
			if _, ok := env[v.Name]; !ok {
				errs = append(errs, fmt.Sprintf("%s: container %s: %s (%s, read by services/%s) is not set (env, or envFrom a rendered ConfigMap)", o.ID(), c.Name, v.Name, v.Field, svc))
			}
		}
	}
	if requireAll {
		for _, s := range Services {
			if !seen[s] {
				errs = append(errs, fmt.Sprintf("no Deployment runs %s (by its app.kubernetes.io/name label or name)", s))
			}
		}
	}
	return errs
}
