package check

import (
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Pods is what the selectors of Services and NetworkPolicies can select: the pod templates of
// the rendered workloads, and the pods the operators create for the rendered custom resources
// (which a NetworkPolicy towards Postgres or RabbitMQ must select).
type Pods struct {
	Owner     string // the rendered object they come from: kind/namespace/name
	Namespace string
	Labels    map[string]string
	Ports     []corev1.ContainerPort // every container's, for port checks
}

// hasPort reports whether the pods expose p: a named port by name, a number by containerPort.
func (p Pods) hasPort(port intstr.IntOrString) bool {
	for _, cp := range p.Ports {
		if port.Type == intstr.String && cp.Name == port.StrVal || port.Type == intstr.Int && cp.ContainerPort == port.IntVal {
			return true
		}
	}
	return false
}

// podSpec is one rendered workload's pod template.
type podSpec struct {
	owner     Object
	namespace string
	labels    map[string]string
	spec      *corev1.PodSpec
}

// podSpecs returns the pod template of every rendered workload (Deployments, StatefulSets,
// DaemonSets, Jobs, CronJobs).
func podSpecs(objs []Object) []podSpec {
	var out []podSpec
	for _, o := range objs {
		var tmpl *corev1.PodTemplateSpec
		switch t := o.Typed.(type) {
		case *appsv1.Deployment:
			tmpl = &t.Spec.Template
		case *appsv1.StatefulSet:
			tmpl = &t.Spec.Template
		case *appsv1.DaemonSet:
			tmpl = &t.Spec.Template
		case *batchv1.Job:
			tmpl = &t.Spec.Template
		case *batchv1.CronJob:
			tmpl = &t.Spec.JobTemplate.Spec.Template
		default:
			continue
		}
		out = append(out, podSpec{owner: o, namespace: o.Namespace, labels: tmpl.Labels, spec: &tmpl.Spec})
	}
	return out
}

// operatorPods are the labels and ports of the pods CloudNativePG and the RabbitMQ Cluster
// Operator create for a Cluster, a Pooler and a RabbitmqCluster (from the operators' docs:
// CloudNativePG "Labels and annotations", the cluster operator's "Labels").
func operatorPods(o Object) (Pods, bool) {
	p := Pods{Owner: o.ID(), Namespace: o.Namespace}
	port := func(name string, n int32) corev1.ContainerPort {
		return corev1.ContainerPort{Name: name, ContainerPort: n}
	}
	switch {
	case o.GVK.Group == "postgresql.cnpg.io" && o.GVK.Kind == "Cluster":
		p.Labels = map[string]string{"cnpg.io/cluster": o.Name, "cnpg.io/podRole": "instance"}
		p.Ports = []corev1.ContainerPort{port("postgresql", 5432), port("metrics", 9187), port("status", 8000)}
	case o.GVK.Group == "postgresql.cnpg.io" && o.GVK.Kind == "Pooler":
		// CloudNativePG labels a Pooler's pods with its cluster too (cnpg.io/cluster).
		p.Labels = map[string]string{"cnpg.io/poolerName": o.Name, "cnpg.io/podRole": "pooler", "cnpg.io/cluster": poolerCluster(o)}
		p.Ports = []corev1.ContainerPort{port("pgbouncer", 5432), port("metrics", 9127)}
	case o.GVK.Group == "rabbitmq.com" && o.GVK.Kind == "RabbitmqCluster":
		p.Labels = map[string]string{"app.kubernetes.io/name": o.Name, "app.kubernetes.io/component": "rabbitmq", "app.kubernetes.io/part-of": "rabbitmq"}
		p.Ports = []corev1.ContainerPort{port("amqp", 5672), port("amqps", 5671), port("management", 15672),
			port("management-tls", 15671), port("prometheus", 15692), port("prometheus-tls", 15691),
			port("epmd", 4369), port("cluster-links", 25672), port("stream", 5552)}
	default:
		return Pods{}, false
	}
	return p, true
}

// AllPods lists every selectable set of pods of the rendered output.
func AllPods(objs []Object) []Pods {
	var out []Pods
	for _, ps := range podSpecs(objs) {
		p := Pods{Owner: ps.owner.ID(), Namespace: ps.namespace, Labels: ps.labels}
		for _, c := range ps.spec.Containers {
			p.Ports = append(p.Ports, c.Ports...)
		}
		out = append(out, p)
	}
	for _, o := range objs {
		if p, ok := operatorPods(o); ok {
			out = append(out, p)
		}
	}
	return out
}

// selected returns the pods in namespace ns that sel selects.
func selected(pods []Pods, ns string, sel labels.Selector) []Pods {
	var out []Pods
	for _, p := range pods {
		if p.Namespace == ns && sel.Matches(labels.Set(p.Labels)) {
			out = append(out, p)
		}
	}
	return out
}

func owners(pods []Pods) string {
	s := make([]string, len(pods))
	for i, p := range pods {
		s[i] = p.Owner
	}
	return fmt.Sprint(s)
}

// poolerCluster is the Cluster a CloudNativePG Pooler serves (spec.cluster.name).
func poolerCluster(o Object) string {
	spec, _ := o.Content["spec"].(map[string]any)
	cluster, _ := spec["cluster"].(map[string]any)
	name, _ := cluster["name"].(string)
	return name
}
