package check

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// crdSchema is one served version of a CRD, prepared the way the API server prepares it: the
// structural schema (for pruning, which is how unknown fields are found), the OpenAPI validator
// and the CEL rules (x-kubernetes-validations).
type crdSchema struct {
	source     string
	structural *structuralschema.Structural
	validator  validation.SchemaValidator
	cel        *cel.Validator
}

// Schemas are the CRD schemas by the group/version/kind they serve.
type Schemas map[schema.GroupVersionKind]*crdSchema

// LoadCRDs reads every CustomResourceDefinition under dir (third_party/crds).
func LoadCRDs(dir string) (Schemas, error) {
	out := Schemas{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || filepath.Ext(path) != ".yaml" {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("read CRD: %w", err)
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal(b, &crd); err != nil {
			return fmt.Errorf("parse CRD %s: %w", path, err)
		}
		for _, v := range crd.Spec.Versions {
			if !v.Served || v.Schema == nil || v.Schema.OpenAPIV3Schema == nil {
				continue
			}
			s, err := newCRDSchema(v.Schema.OpenAPIV3Schema)
			if err != nil {
				return fmt.Errorf("CRD %s version %s: %w", path, v.Name, err)
			}
			s.source = filepath.Base(path)
			out[schema.GroupVersionKind{Group: crd.Spec.Group, Version: v.Name, Kind: crd.Spec.Names.Kind}] = s
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("load CRDs from %s: %w", dir, err)
	}
	return out, nil
}

func newCRDSchema(v1 *apiextensionsv1.JSONSchemaProps) (*crdSchema, error) {
	var internal apiextensions.JSONSchemaProps
	if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(v1, &internal, nil); err != nil {
		return nil, fmt.Errorf("convert the schema: %w", err)
	}
	st, err := structuralschema.NewStructural(&internal)
	if err != nil {
		return nil, fmt.Errorf("structural schema: %w", err)
	}
	v, _, err := validation.NewSchemaValidator(&internal)
	if err != nil {
		return nil, fmt.Errorf("schema validator: %w", err)
	}
	return &crdSchema{structural: st, validator: v, cel: cel.NewValidator(st, true, celconfig.PerCallLimit)}, nil
}

// ValidateCustom checks every custom resource against its CRD's schema as the API server would
// on create: a field the schema does not declare (and does not preserve) is an error, not
// silently pruned; then the OpenAPI validation and the CEL rules. A custom resource whose kind
// has no CRD is an error too. Each message names the object and the field path.
func ValidateCustom(objs []Object, schemas Schemas) []string {
	var errs []string
	for _, o := range objs {
		if o.Typed != nil || builtinGroups[o.GVK.Group] {
			continue
		}
		s, ok := schemas[o.GVK]
		if !ok {
			errs = append(errs, fmt.Sprintf("%s: no CRD serves %s (vendor the operator's CRD into third_party/crds)", o.ID(), o.GVK))
			continue
		}
		errs = append(errs, s.validate(o)...)
	}
	return errs
}

func (s *crdSchema) validate(o Object) []string {
	var errs []string
	pruned := runtime.DeepCopyJSON(o.Content)
	unknown := pruning.PruneWithOptions(pruned, s.structural, true, structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true})
	sort.Strings(unknown)
	for _, p := range unknown {
		errs = append(errs, fmt.Sprintf("%s: unknown field %q (not in %s)", o.ID(), p, s.source))
	}
	errs = append(errs, metadataErrs(o)...)
	for _, e := range validation.ValidateCustomResource(nil, o.Content, s.validator) {
		errs = append(errs, fmt.Sprintf("%s: %s (%s)", o.ID(), e.Error(), s.source))
	}
	celErrs, _ := s.cel.Validate(context.Background(), nil, s.structural, o.Content, nil, celconfig.RuntimeCELCostBudget)
	for _, e := range celErrs {
		errs = append(errs, fmt.Sprintf("%s: %s (%s, CEL rule)", o.ID(), e.Error(), s.source))
	}
	return errs
}

// metadataErrs decodes a custom resource's metadata strictly into ObjectMeta: pruning leaves
// metadata to the API server's ObjectMeta handling, which refuses unknown fields there too.
func metadataErrs(o Object) []string {
	b, err := json.Marshal(map[string]any{"metadata": o.Content["metadata"]})
	if err != nil {
		return []string{fmt.Sprintf("%s: encode metadata: %v", o.ID(), err)}
	}
	var m struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
	}
	strictErrs, err := kjson.UnmarshalStrict(b, &m, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return []string{fmt.Sprintf("%s: metadata: %v", o.ID(), err)}
	}
	errs := make([]string, len(strictErrs))
	for i, e := range strictErrs {
		errs[i] = fmt.Sprintf("%s: %v", o.ID(), e)
	}
	return errs
}

// joinErrs formats a list of failures for one t.Error/t.Fatal.
func joinErrs(errs []string) string { return strings.Join(errs, "\n  ") }
