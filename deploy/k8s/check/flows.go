package check

import (
	"fmt"
	"net"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// flow is a connection a workload makes: from its pods to a Service's pods on a container port.
type flow struct {
	from, to Pods
	port     corev1.ContainerPort
	what     string // where the flow comes from: "<owner> <container> VAR=host:port"
}

// dependencyVars are the variables besides *_ADDR that name a host a service connects to.
var dependencyVars = map[string]bool{"INTEGRATIONS_DATABASE_URL": true, "INTEGRATIONS_AMQP_URL": true}

// kubeVar is Kubernetes' $(VAR) expansion in a value, replaced before the value is parsed.
var kubeVar = regexp.MustCompile(`\$\([A-Za-z_][A-Za-z0-9_]*\)`)

// Flows asserts that the NetworkPolicies allow every connection the rendered workloads are
// configured to make: each container's (init containers' too) INTEGRATIONS_*_ADDR, database URL
// and AMQP URL whose host is a Service of the rendered output — or one the operators create for
// a rendered Cluster, Pooler or RabbitmqCluster — must be allowed out of its pods (their egress
// policies) and into the Service's pods (theirs), on the container port the Service sends to.
// Addresses of anything else (listen addresses, hosts outside the cluster) are not flows here.
// Each failure names the workload, the variable and the policy side that blocks it.
func Flows(objs []Object, cms ConfigMaps, pods []Pods) []string {
	var policies []Object
	for _, o := range objs {
		if _, ok := o.Typed.(*networkingv1.NetworkPolicy); ok {
			policies = append(policies, o)
		}
	}
	flows, errs := requiredFlows(objs, cms)
	for _, f := range flows {
		if p := blocking(policies, f.from, f.to, f.port, networkingv1.PolicyTypeEgress); p != "" {
			errs = append(errs, fmt.Sprintf("%s: no egress rule of %s lets it reach %s on port %d", f.what, p, f.to.Owner, f.port.ContainerPort))
		}
		if p := blocking(policies, f.to, f.from, f.port, networkingv1.PolicyTypeIngress); p != "" {
			errs = append(errs, fmt.Sprintf("%s: no ingress rule of %s lets it into %s on port %d", f.what, p, f.to.Owner, f.port.ContainerPort))
		}
	}
	return errs
}

// requiredFlows derives the flows from every workload's containers.
func requiredFlows(objs []Object, cms ConfigMaps) ([]flow, []string) {
	services := serviceTargets(objs)
	var flows []flow
	var errs []string
	for _, ps := range podSpecs(objs) {
		from := Pods{Owner: ps.owner.ID(), Namespace: ps.namespace, Labels: ps.labels}
		containers := append(append([]corev1.Container(nil), ps.spec.InitContainers...), ps.spec.Containers...)
		for i := range containers {
			c := &containers[i]
			env, _ := containerEnv(ps.owner, c, cms) // unresolvable references: Env's failures
			names := make([]string, 0, len(env))
			for name := range env {
				names = append(names, name)
			}
			sort.Strings(names)
			for _, name := range names {
				v := env[name]
				if !v.known || !(strings.HasSuffix(name, "_ADDR") || dependencyVars[name]) {
					continue
				}
				host, port, ok := hostPort(v.value)
				if !ok {
					continue
				}
				target, ok := services[ps.namespace+"/"+serviceName(host, ps.namespace)]
				if !ok {
					continue
				}
				what := fmt.Sprintf("%s: container %s: %s=%s:%d", ps.owner.ID(), c.Name, name, host, port)
				cp, ok := target.containerPort(port)
				if !ok {
					errs = append(errs, fmt.Sprintf("%s: Service %s has no port %d", what, target.name, port))
					continue
				}
				for _, to := range target.pods {
					flows = append(flows, flow{from: from, to: to, port: cp, what: what})
				}
			}
		}
	}
	return flows, errs
}

// hostPort reads host and port from a host:port or a URL (with $(VAR) references replaced).
func hostPort(value string) (string, int32, bool) {
	value = kubeVar.ReplaceAllString(value, "x")
	if strings.Contains(value, "://") {
		u, err := url.Parse(value)
		if err != nil || u.Port() == "" {
			return "", 0, false
		}
		value = u.Host
	}
	host, p, err := net.SplitHostPort(value)
	if err != nil {
		return "", 0, false
	}
	port, err := strconv.ParseInt(p, 10, 32)
	if err != nil || host == "" || net.ParseIP(host) != nil || host == "localhost" {
		return "", 0, false
	}
	return host, int32(port), true
}

// serviceName is the Service a host names, for hosts of the forms <name>, <name>.<ns>,
// <name>.<ns>.svc and <name>.<ns>.svc.<cluster domain> in namespace ns.
func serviceName(host, ns string) string {
	parts := strings.Split(strings.TrimSuffix(host, "."), ".")
	if len(parts) == 1 || parts[1] == ns {
		return parts[0]
	}
	return ""
}

// serviceTarget is a Service's ports and the pods it sends them to.
type serviceTarget struct {
	name  string
	ports []corev1.ServicePort
	pods  []Pods
}

// containerPort is the container port the Service's port sends to (its targetPort, by name or
// number), as the pods declare it.
func (s serviceTarget) containerPort(port int32) (corev1.ContainerPort, bool) {
	for _, sp := range s.ports {
		if sp.Port != port {
			continue
		}
		target := sp.TargetPort
		if target.Type == intstr.Int && target.IntVal == 0 {
			target = intstr.FromInt32(sp.Port)
		}
		for _, p := range s.pods {
			for _, cp := range p.Ports {
				if target.Type == intstr.String && cp.Name == target.StrVal || target.Type == intstr.Int && cp.ContainerPort == target.IntVal {
					return cp, true
				}
			}
		}
	}
	return corev1.ContainerPort{}, false
}

// serviceTargets are the rendered Services and those the operators create, by namespace/name:
// CloudNativePG's <cluster>-rw, -ro and -r (the instances) and <pooler> (the pooler's pods), the
// RabbitMQ Cluster Operator's <cluster> (its nodes).
func serviceTargets(objs []Object) map[string]serviceTarget {
	all := AllPods(objs)
	out := map[string]serviceTarget{}
	for _, o := range objs {
		if s, ok := o.Typed.(*corev1.Service); ok && len(s.Spec.Selector) > 0 {
			out[o.Namespace+"/"+o.Name] = serviceTarget{name: o.Name, ports: s.Spec.Ports,
				pods: selected(all, o.Namespace, labels.SelectorFromSet(s.Spec.Selector))}
			continue
		}
		p, ok := operatorPods(o)
		if !ok {
			continue
		}
		var ports []corev1.ServicePort
		for _, cp := range p.Ports {
			ports = append(ports, corev1.ServicePort{Port: cp.ContainerPort, TargetPort: intstr.FromInt32(cp.ContainerPort)})
		}
		names := []string{o.Name}
		if o.GVK.Kind == "Cluster" {
			names = []string{o.Name + "-rw", o.Name + "-ro", o.Name + "-r"}
		}
		for _, n := range names {
			out[o.Namespace+"/"+n] = serviceTarget{name: n, ports: ports, pods: []Pods{p}}
		}
	}
	return out
}

// blocking returns the policy side that keeps pods from talking to peer on port in direction
// dir (Egress: pods → peer; Ingress: peer → pods): "" when allowed — no policy of that direction
// selects pods, or a rule of one that does admits peer and port — else the policies that
// select pods, named.
func blocking(policies []Object, pods, peer Pods, port corev1.ContainerPort, dir networkingv1.PolicyType) string {
	var selecting []string
	for _, o := range policies {
		np := o.Typed.(*networkingv1.NetworkPolicy)
		if o.Namespace != pods.Namespace || !hasType(np, dir) || !matches(&np.Spec.PodSelector, pods.Labels) {
			continue
		}
		selecting = append(selecting, o.ID())
		if dir == networkingv1.PolicyTypeEgress {
			for _, r := range np.Spec.Egress {
				if peersAdmit(r.To, o.Namespace, peer) && portsAdmit(r.Ports, port) {
					return ""
				}
			}
		} else {
			for _, r := range np.Spec.Ingress {
				if peersAdmit(r.From, o.Namespace, peer) && portsAdmit(r.Ports, port) {
					return ""
				}
			}
		}
	}
	if len(selecting) == 0 {
		return ""
	}
	return strings.Join(selecting, ", ")
}

// hasType reports whether a policy restricts direction dir (policyTypes, or, when empty,
// Ingress always and Egress if it has egress rules — the API's defaulting).
func hasType(np *networkingv1.NetworkPolicy, dir networkingv1.PolicyType) bool {
	if len(np.Spec.PolicyTypes) == 0 {
		return dir == networkingv1.PolicyTypeIngress || len(np.Spec.Egress) > 0
	}
	for _, t := range np.Spec.PolicyTypes {
		if t == dir {
			return true
		}
	}
	return false
}

func matches(sel *metav1.LabelSelector, l map[string]string) bool {
	s, err := metav1.LabelSelectorAsSelector(sel)
	return err == nil && s.Matches(labels.Set(l))
}

// peersAdmit reports whether a rule's peers include peer (no peers: everyone). A pod selector
// alone means the policy's namespace; a namespace selector is matched against the namespace's
// kubernetes.io/metadata.name label, the only one known offline; an ipBlock selects no pod.
func peersAdmit(peers []networkingv1.NetworkPolicyPeer, ns string, peer Pods) bool {
	if len(peers) == 0 {
		return true
	}
	for _, p := range peers {
		if p.IPBlock != nil {
			continue
		}
		nsOK := peer.Namespace == ns
		if p.NamespaceSelector != nil {
			nsOK = matches(p.NamespaceSelector, map[string]string{"kubernetes.io/metadata.name": peer.Namespace})
		}
		if nsOK && (p.PodSelector == nil || matches(p.PodSelector, peer.Labels)) {
			return true
		}
	}
	return false
}

// portsAdmit reports whether a rule's ports include port (no ports: all), by number, range or
// name.
func portsAdmit(ports []networkingv1.NetworkPolicyPort, port corev1.ContainerPort) bool {
	if len(ports) == 0 {
		return true
	}
	for _, p := range ports {
		switch {
		case p.Protocol != nil && *p.Protocol != corev1.ProtocolTCP:
		case p.Port == nil:
			return true
		case p.Port.Type == intstr.String:
			if p.Port.StrVal == port.Name {
				return true
			}
		case p.EndPort != nil:
			if port.ContainerPort >= p.Port.IntVal && port.ContainerPort <= *p.EndPort {
				return true
			}
		case p.Port.IntVal == port.ContainerPort:
			return true
		}
	}
	return false
}
