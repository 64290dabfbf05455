package check

import (
	"encoding/json"
	"fmt"
)

// Options are what the checks of one rendered overlay need besides its objects.
type Options struct {
	Schemas Schemas
	// Vars are the variables each service reads (ConfigVars), by service.
	Vars map[string][]Var
	// Image is the reference every container must run (ImageSetting).
	Image string
	// AllServices requires a Deployment for each of the six services (the real overlays; the
	// test fixture has one).
	AllServices bool
}

// Check runs every check on the rendered documents and returns the failures, each naming the
// object. The objects are returned too, for the counts.
func Check(docs []Doc, o Options) ([]Object, []string) {
	objs, errs := Decode(docs)
	errs = append(errs, ValidateCustom(objs, o.Schemas)...)
	cms := RenderedConfigMaps(objs)
	pods := AllPods(objs)
	errs = append(errs, Deployments(objs, cms)...)
	errs = append(errs, Env(objs, cms, o.Vars, o.AllServices)...)
	errs = append(errs, ServiceSelectors(objs, pods)...)
	errs = append(errs, NetworkPolicies(objs, pods)...)
	errs = append(errs, Flows(objs, cms, pods)...)
	errs = append(errs, ServiceMonitors(objs)...)
	errs = append(errs, Scaling(objs, pods)...)
	errs = append(errs, Isolation(objs)...)
	errs = append(errs, Images(objs, o.Image)...)
	return objs, errs
}

// fromContent converts part of an object's content into a typed value.
func fromContent(v any, out any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode: %w", err)
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	return nil
}
