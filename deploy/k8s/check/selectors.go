package check

import (
	"fmt"
	"slices"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// ServiceSelectors asserts that every Service selects the pods of a rendered workload (or of an
// operator's pods) in its namespace and that each targetPort exists on them: a selector that
// matches nothing leaves the Service without endpoints, which nothing else would report.
func ServiceSelectors(objs []Object, pods []Pods) []string {
	var errs []string
	for _, o := range objs {
		s, ok := o.Typed.(*corev1.Service)
		if !ok || s.Spec.Type == corev1.ServiceTypeExternalName {
			continue
		}
		if len(s.Spec.Selector) == 0 {
			errs = append(errs, fmt.Sprintf("%s: no selector (a Service of the platform selects its Deployment's pods)", o.ID()))
			continue
		}
		sel := labels.SelectorFromSet(s.Spec.Selector)
		matched := selected(pods, o.Namespace, sel)
		if len(matched) == 0 {
			errs = append(errs, fmt.Sprintf("%s: selector %s selects no pods of the rendered output", o.ID(), sel))
			continue
		}
		for _, p := range s.Spec.Ports {
			target := p.TargetPort
			if target.Type == intstr.Int && target.IntVal == 0 {
				target = intstr.FromInt32(p.Port)
			}
			if !anyHasPort(matched, target) {
				errs = append(errs, fmt.Sprintf("%s: port %s: targetPort %s is not a container port of %s", o.ID(), p.Name, target.String(), owners(matched)))
			}
		}
	}
	return errs
}

func anyHasPort(pods []Pods, port intstr.IntOrString) bool {
	for _, p := range pods {
		if p.hasPort(port) {
			return true
		}
	}
	return false
}

// NetworkPolicies asserts that every NetworkPolicy's podSelector selects pods of the
// rendered output (an empty one, all of them, is the default deny), that every peer selected by
// pod labels in the namespace exists, and that the ports a rule allows exist on the pods it is
// about: the selected pods for ingress, the peer pods for egress. A peer given by a
// namespaceSelector (Prometheus, DNS, an ingress controller) or an ipBlock is outside the
// rendered output and is taken as written. Each failure names the policy and the rule.
func NetworkPolicies(objs []Object, pods []Pods) []string {
	var errs []string
	for _, o := range objs {
		np, ok := o.Typed.(*networkingv1.NetworkPolicy)
		if !ok {
			continue
		}
		fail := func(format string, args ...any) {
			errs = append(errs, fmt.Sprintf("%s: %s", o.ID(), fmt.Sprintf(format, args...)))
		}
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil {
			fail("podSelector: %v", err)
			continue
		}
		targets := selected(pods, o.Namespace, sel)
		if len(targets) == 0 {
			fail("podSelector %s selects no pods of the rendered output", sel)
			continue
		}
		for i, r := range np.Spec.Ingress {
			where := fmt.Sprintf("ingress[%d]", i)
			peerErrs(where, r.From, o.Namespace, pods, fail)
			for _, p := range r.Ports {
				if p.Port != nil && !anyHasPort(targets, *p.Port) {
					fail("%s: port %s is not a container port of the selected pods %s", where, p.Port.String(), owners(targets))
				}
			}
		}
		for i, r := range np.Spec.Egress {
			where := fmt.Sprintf("egress[%d]", i)
			peers, checkable := peerErrs(where, r.To, o.Namespace, pods, fail)
			if !checkable || len(peers) == 0 { // no peers: already reported
				continue
			}
			for _, p := range r.Ports {
				if p.Port != nil && !anyHasPort(peers, *p.Port) {
					fail("%s: port %s is not a container port of the peers %s", where, p.Port.String(), owners(peers))
				}
			}
		}
	}
	return errs
}

// peerErrs checks each in-namespace pod peer and returns the pods they select; checkable is
// false when some peer is outside the rendered output (or the rule allows every peer), so the
// rule's ports cannot be checked against peers.
func peerErrs(where string, peers []networkingv1.NetworkPolicyPeer, ns string, pods []Pods, fail func(string, ...any)) (matched []Pods, checkable bool) {
	if len(peers) == 0 {
		return nil, false
	}
	checkable = true
	for j, peer := range peers {
		if peer.NamespaceSelector != nil || peer.IPBlock != nil || peer.PodSelector == nil {
			checkable = false
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(peer.PodSelector)
		if err != nil {
			fail("%s peer %d: %v", where, j, err)
			continue
		}
		m := selected(pods, ns, sel)
		if len(m) == 0 {
			fail("%s peer %d: podSelector %s selects no pods of the rendered output", where, j, sel)
		}
		matched = append(matched, m...)
	}
	return matched, checkable
}

// ServiceMonitors asserts that every ServiceMonitor selects a rendered Service (in its
// namespace, or those its namespaceSelector names) that has each endpoint's named port: else Prometheus scrapes nothing and the
// alerts built on those metrics never fire.
func ServiceMonitors(objs []Object) []string {
	var errs []string
	var services []Object
	for _, o := range objs {
		if _, ok := o.Typed.(*corev1.Service); ok {
			services = append(services, o)
		}
	}
	for _, o := range objs {
		if o.GVK.Group != "monitoring.coreos.com" || o.GVK.Kind != "ServiceMonitor" {
			continue
		}
		spec, _ := o.Content["spec"].(map[string]any)
		var ls metav1.LabelSelector
		if err := fromContent(spec["selector"], &ls); err != nil {
			errs = append(errs, fmt.Sprintf("%s: selector: %v", o.ID(), err))
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(&ls)
		if err != nil || sel.Empty() {
			errs = append(errs, fmt.Sprintf("%s: selector %v is empty or invalid (%v)", o.ID(), spec["selector"], err))
			continue
		}
		// spec.namespaceSelector widens where the Services are looked for: any, or named ones.
		var nsSel struct {
			Any        bool     `json:"any"`
			MatchNames []string `json:"matchNames"`
		}
		if err := fromContent(spec["namespaceSelector"], &nsSel); err != nil {
			errs = append(errs, fmt.Sprintf("%s: namespaceSelector: %v", o.ID(), err))
			continue
		}
		inScope := func(ns string) bool {
			if nsSel.Any {
				return true
			}
			if len(nsSel.MatchNames) == 0 {
				return ns == o.Namespace
			}
			return slices.Contains(nsSel.MatchNames, ns)
		}
		var matched []*corev1.Service
		for _, so := range services {
			s := so.Typed.(*corev1.Service)
			if inScope(so.Namespace) && sel.Matches(labels.Set(s.Labels)) {
				matched = append(matched, s)
			}
		}
		if len(matched) == 0 {
			errs = append(errs, fmt.Sprintf("%s: selector %s selects no Service of the rendered output (it matches Service labels)", o.ID(), sel))
			continue
		}
		eps, _ := spec["endpoints"].([]any)
		for i, e := range eps {
			port, _ := e.(map[string]any)["port"].(string)
			if port == "" {
				continue
			}
			found := false
			for _, s := range matched {
				for _, p := range s.Spec.Ports {
					found = found || p.Name == port
				}
			}
			if !found {
				errs = append(errs, fmt.Sprintf("%s: endpoints[%d]: no selected Service has a port named %q", o.ID(), i, port))
			}
		}
	}
	return errs
}

// Scaling asserts that every PodDisruptionBudget selects rendered pods and every
// HorizontalPodAutoscaler scales a rendered workload: either, pointed at nothing, protects or
// scales nothing, silently.
func Scaling(objs []Object, pods []Pods) []string {
	var errs []string
	byID := map[string]bool{}
	for _, o := range objs {
		byID[objectID(o.GVK.Kind, o.Namespace, o.Name)] = true
	}
	for _, o := range objs {
		switch t := o.Typed.(type) {
		case *policyv1.PodDisruptionBudget:
			if t.Spec.Selector == nil {
				errs = append(errs, fmt.Sprintf("%s: no selector", o.ID()))
				continue
			}
			sel, err := metav1.LabelSelectorAsSelector(t.Spec.Selector)
			if err != nil {
				errs = append(errs, fmt.Sprintf("%s: selector: %v", o.ID(), err))
				continue
			}
			if len(selected(pods, o.Namespace, sel)) == 0 {
				errs = append(errs, fmt.Sprintf("%s: selector %s selects no pods of the rendered output", o.ID(), sel))
			}
		case *autoscalingv2.HorizontalPodAutoscaler:
			ref := t.Spec.ScaleTargetRef
			if !byID[objectID(ref.Kind, o.Namespace, ref.Name)] {
				errs = append(errs, fmt.Sprintf("%s: scaleTargetRef %s/%s is not in the rendered output", o.ID(), ref.Kind, ref.Name))
			}
		}
	}
	return errs
}

// Isolation asserts that every rendered workload's pods are selected by some NetworkPolicy
// for ingress and by some for egress: the flows the architecture allows are listed, so a pod no
// policy selects is open in both directions, which is what "deny the rest" excludes.
func Isolation(objs []Object) []string {
	type policy struct {
		ns              string
		sel             labels.Selector
		ingress, egress bool
	}
	var policies []policy
	for _, o := range objs {
		np, ok := o.Typed.(*networkingv1.NetworkPolicy)
		if !ok {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil {
			continue // NetworkPolicies reports it
		}
		p := policy{ns: o.Namespace, sel: sel}
		// Without policyTypes, a policy is about ingress, and about egress when it has egress rules.
		if len(np.Spec.PolicyTypes) == 0 {
			p.ingress, p.egress = true, len(np.Spec.Egress) > 0
		}
		for _, t := range np.Spec.PolicyTypes {
			p.ingress = p.ingress || t == networkingv1.PolicyTypeIngress
			p.egress = p.egress || t == networkingv1.PolicyTypeEgress
		}
		policies = append(policies, p)
	}
	var errs []string
	for _, ps := range podSpecs(objs) {
		var ingress, egress bool
		for _, p := range policies {
			if p.ns == ps.namespace && p.sel.Matches(labels.Set(ps.labels)) {
				ingress, egress = ingress || p.ingress, egress || p.egress
			}
		}
		if !ingress {
			errs = append(errs, fmt.Sprintf("%s: no NetworkPolicy selects its pods for Ingress (all ingress is open)", ps.owner.ID()))
		}
		if !egress {
			errs = append(errs, fmt.Sprintf("%s: no NetworkPolicy selects its pods for Egress (all egress is open)", ps.owner.ID()))
		}
	}
	return errs
}
