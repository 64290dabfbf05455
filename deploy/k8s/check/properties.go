package check

import (
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// Deployments asserts what every Deployment of the platform must carry: the three probes,
// requests and a memory limit on every container, a locked-down securityContext, and a
// termination grace period longer than the shutdown timeout the service is given (else the
// kubelet kills it mid-drain). Each failure names the Deployment and the container.
//
// CPU limits are not required: a CPU limit throttles a Go process (its GC included) under bursts
// while the node has idle cores; memory is the limit that protects the node.
func Deployments(objs []Object, cms ConfigMaps) []string {
	var errs []string
	for _, o := range objs {
		d, ok := o.Typed.(*appsv1.Deployment)
		if !ok {
			continue
		}
		spec := &d.Spec.Template.Spec
		fail := func(c *corev1.Container, format string, args ...any) {
			errs = append(errs, fmt.Sprintf("%s: container %s: %s", o.ID(), c.Name, fmt.Sprintf(format, args...)))
		}
		for i := range spec.Containers {
			c := &spec.Containers[i]
			if c.ReadinessProbe == nil {
				fail(c, "no readinessProbe")
			}
			if c.LivenessProbe == nil {
				fail(c, "no livenessProbe")
			}
			if c.StartupProbe == nil {
				fail(c, "no startupProbe")
			}
		}
		for _, c := range allContainers(spec) {
			for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
				if _, ok := c.Resources.Requests[r]; !ok {
					fail(c, "no resources.requests.%s", r)
				}
			}
			if _, ok := c.Resources.Limits[corev1.ResourceMemory]; !ok {
				fail(c, "no resources.limits.memory")
			}
			errs = append(errs, securityErrs(o, spec, c)...)
		}
		errs = append(errs, graceErrs(o, spec, cms)...)
	}
	return errs
}

func allContainers(spec *corev1.PodSpec) []*corev1.Container {
	var out []*corev1.Container
	for i := range spec.InitContainers {
		out = append(out, &spec.InitContainers[i])
	}
	for i := range spec.Containers {
		out = append(out, &spec.Containers[i])
	}
	return out
}

func securityErrs(o Object, spec *corev1.PodSpec, c *corev1.Container) []string {
	var errs []string
	fail := func(msg string) { errs = append(errs, fmt.Sprintf("%s: container %s: %s", o.ID(), c.Name, msg)) }
	sc := c.SecurityContext
	if sc == nil {
		sc = &corev1.SecurityContext{}
	}
	// runAsNonRoot may be set once for the pod; the others exist only per container.
	nonRoot := sc.RunAsNonRoot
	if nonRoot == nil && spec.SecurityContext != nil {
		nonRoot = spec.SecurityContext.RunAsNonRoot
	}
	if nonRoot == nil || !*nonRoot {
		fail("securityContext.runAsNonRoot is not true (container or pod)")
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		fail("securityContext.readOnlyRootFilesystem is not true")
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		fail("securityContext.allowPrivilegeEscalation is not false")
	}
	dropsAll := false
	if sc.Capabilities != nil {
		for _, d := range sc.Capabilities.Drop {
			dropsAll = dropsAll || d == "ALL"
		}
	}
	if !dropsAll {
		fail("securityContext.capabilities.drop does not include ALL")
	}
	return errs
}

// graceErrs compares terminationGracePeriodSeconds with every container's
// INTEGRATIONS_SHUTDOWN_TIMEOUT. A container that sets none is the env check's failure, not this
// one's.
func graceErrs(o Object, spec *corev1.PodSpec, cms ConfigMaps) []string {
	var errs []string
	grace := int64(corev1.DefaultTerminationGracePeriodSeconds)
	if spec.TerminationGracePeriodSeconds != nil {
		grace = *spec.TerminationGracePeriodSeconds
	}
	for i := range spec.Containers {
		c := &spec.Containers[i]
		env, _ := containerEnv(o, c, cms)
		v, ok := env["INTEGRATIONS_SHUTDOWN_TIMEOUT"]
		if !ok {
			continue
		}
		if !v.known {
			errs = append(errs, fmt.Sprintf("%s: container %s: INTEGRATIONS_SHUTDOWN_TIMEOUT comes from %s, whose value cannot be compared with terminationGracePeriodSeconds offline: set it in a ConfigMap", o.ID(), c.Name, v.from))
			continue
		}
		d, err := time.ParseDuration(v.value)
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: container %s: INTEGRATIONS_SHUTDOWN_TIMEOUT %q: %v", o.ID(), c.Name, v.value, err))
			continue
		}
		if time.Duration(grace)*time.Second <= d {
			errs = append(errs, fmt.Sprintf("%s: terminationGracePeriodSeconds %d is not longer than container %s's INTEGRATIONS_SHUTDOWN_TIMEOUT %s: the kubelet would kill it before its shutdown ends", o.ID(), grace, c.Name, d))
		}
	}
	return errs
}
