package check

import (
	"encoding/json"
	"fmt"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// Object is a rendered object, decoded: Typed is set for a built-in kind (a k8s.io/api type),
// Content for every object (the JSON as a map, what the CRD schemas validate).
type Object struct {
	GVK       schema.GroupVersionKind
	Namespace string
	Name      string
	Content   map[string]any
	Typed     runtime.Object
}

// ID names the object in every failure: kind/namespace/name.
func (o Object) ID() string { return objectID(o.GVK.Kind, o.Namespace, o.Name) }

func objectID(kind, ns, name string) string {
	if ns == "" {
		return kind + "/" + name
	}
	return kind + "/" + ns + "/" + name
}

// builtins knows the built-in API groups a deployment of the platform uses; a built-in kind
// outside them fails the decoding (add its group here) rather than passing unchecked.
var builtins = func() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		corev1.AddToScheme, appsv1.AddToScheme, batchv1.AddToScheme, policyv1.AddToScheme,
		autoscalingv2.AddToScheme, networkingv1.AddToScheme, rbacv1.AddToScheme,
	} {
		if err := add(s); err != nil {
			panic(fmt.Sprintf("register the built-in API types: %v", err))
		}
	}
	return s
}()

// builtinGroups are the groups served by Kubernetes itself: an object of one of them that the
// scheme does not know is an error, not a custom resource.
var builtinGroups = map[string]bool{
	"": true, "apps": true, "batch": true, "policy": true, "autoscaling": true,
	"networking.k8s.io": true, "rbac.authorization.k8s.io": true, "storage.k8s.io": true,
	"scheduling.k8s.io": true, "coordination.k8s.io": true, "discovery.k8s.io": true,
	"admissionregistration.k8s.io": true, "apiextensions.k8s.io": true, "certificates.k8s.io": true,
}

// Decode turns the rendered documents into Objects. A document with a duplicate key, or a
// built-in object with a field its k8s.io/api type lacks, is an error naming the object and the
// field: the API server would reject (or, for an older client-side apply, silently drop) it.
// Custom resources are only parsed here; ValidateCustom checks them against their CRDs.
func Decode(docs []Doc) ([]Object, []string) {
	var objs []Object
	var errs []string
	for i, d := range docs {
		o, err := decodeDoc(d)
		if err != nil {
			errs = append(errs, fmt.Sprintf("strict decoding of document %d: %v", i, err))
			continue
		}
		objs = append(objs, o)
	}
	return objs, errs
}

func decodeDoc(d Doc) (Object, error) {
	// Strict YAML to JSON refuses duplicate keys, which JSON decoding could no longer see.
	j, dupErr := yaml.YAMLToJSONStrict(d.YAML)
	if dupErr != nil {
		j2, err := yaml.YAMLToJSON(d.YAML)
		if err != nil {
			return Object{}, fmt.Errorf("parse YAML: %w", err)
		}
		j = j2
	}
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(j, &head); err != nil {
		return Object{}, fmt.Errorf("parse object head: %w", err)
	}
	gv, err := schema.ParseGroupVersion(head.APIVersion)
	if err != nil {
		return Object{}, fmt.Errorf("%s: apiVersion %q: %w", objectID(head.Kind, head.Metadata.Namespace, head.Metadata.Name), head.APIVersion, err)
	}
	o := Object{GVK: gv.WithKind(head.Kind), Namespace: head.Metadata.Namespace, Name: head.Metadata.Name}
	if dupErr != nil {
		// yaml's message spans lines ("unmarshal errors:\n  line 9: key ..."): keep it on one.
		return o, fmt.Errorf("%s: duplicate field: %s", o.ID(), strings.Join(strings.Fields(dupErr.Error()), " "))
	}
	if err := json.Unmarshal(j, &o.Content); err != nil {
		return o, fmt.Errorf("%s: %w", o.ID(), err)
	}
	if !builtinGroups[gv.Group] {
		return o, nil
	}
	typed, err := builtins.New(o.GVK)
	if err != nil {
		return o, fmt.Errorf("%s: built-in kind %s unknown to the check (add its k8s.io/api group to builtins): %w", o.ID(), o.GVK, err)
	}
	// sigs.k8s.io/json's strict mode is the API server's own: it names each unknown or
	// duplicate field by its path (spec.template.spec.containers[0].imagePullPolice).
	strictErrs, err := kjson.UnmarshalStrict(j, typed, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return o, fmt.Errorf("%s: decode into %T: %w", o.ID(), typed, err)
	}
	if len(strictErrs) > 0 {
		msgs := make([]string, len(strictErrs))
		for i, e := range strictErrs {
			msgs[i] = e.Error()
		}
		return o, fmt.Errorf("%s: %s", o.ID(), strings.Join(msgs, "; "))
	}
	o.Typed = typed
	return o, nil
}
