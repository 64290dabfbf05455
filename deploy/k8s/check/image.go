package check

import (
	"fmt"
	"os"
	"path/filepath"

	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/yaml"
)

// Image is the name of the platform's one image in the manifests; the overlays set its tag.
const Image = "integrations"

// ImageSetting reads the reference the overlay at dir gives Image (its kustomization's
// `images:` entry) and checks that it is the one place the tag is set: no other kustomization
// the overlay includes (resources, components, recursively) has an entry for Image.
func ImageSetting(dir string) (string, []string) {
	var ref string
	var errs []string
	var walk func(d string, top bool)
	seen := map[string]bool{}
	walk = func(d string, top bool) {
		if seen[d] {
			return
		}
		seen[d] = true
		k, err := readKustomization(d)
		if err != nil {
			errs = append(errs, err.Error())
			return
		}
		for _, im := range k.Images {
			if im.Name != Image {
				continue
			}
			if !top {
				errs = append(errs, fmt.Sprintf("%s/kustomization.yaml sets image %s too: the tag is set once, in the overlay", d, Image))
				continue
			}
			name := im.Name
			if im.NewName != "" {
				name = im.NewName
			}
			switch {
			case im.Digest != "":
				ref = name + "@" + im.Digest
			case im.NewTag != "":
				ref = name + ":" + im.NewTag
			default:
				errs = append(errs, fmt.Sprintf("%s/kustomization.yaml: images entry %s sets no newTag or digest", d, Image))
			}
		}
		for _, r := range append(append([]string{}, k.Resources...), k.Components...) {
			sub := filepath.Join(d, r)
			if fi, err := os.Stat(sub); err == nil && fi.IsDir() {
				walk(sub, false)
			}
		}
	}
	walk(dir, true)
	if ref == "" && len(errs) == 0 {
		errs = append(errs, fmt.Sprintf("%s/kustomization.yaml has no images entry for %s: the overlay sets the tag", dir, Image))
	}
	return ref, errs
}

func readKustomization(dir string) (*types.Kustomization, error) {
	b, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		return nil, fmt.Errorf("read kustomization: %w", err)
	}
	var k types.Kustomization
	if err := yaml.Unmarshal(b, &k); err != nil {
		return nil, fmt.Errorf("parse %s/kustomization.yaml: %w", dir, err)
	}
	return &k, nil
}

// Images asserts that every container of every rendered workload runs ref, the overlay's
// image: one image for the platform, its tag set in one place.
func Images(objs []Object, ref string) []string {
	var errs []string
	for _, ps := range podSpecs(objs) {
		for _, c := range allContainers(ps.spec) {
			if c.Image != ref {
				errs = append(errs, fmt.Sprintf("%s: container %s: image %q is not the overlay's %q", ps.owner.ID(), c.Name, c.Image, ref))
			}
		}
	}
	return errs
}
