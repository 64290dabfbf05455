package check

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// Doc is one rendered object, as the YAML kustomize wrote for it: the checks start from the text
// so that duplicate keys, which any decoding into a map or struct would hide, are still visible.
type Doc struct {
	YAML []byte
}

// RepoRoot finds the repository root from dir (a test's working directory) by walking up to the
// directory holding go.work.
func RepoRoot(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("repo root from %s: %w", dir, err)
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.work")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("repo root: no go.work in %s or any parent", dir)
		}
	}
}

// renderMu serializes kustomize runs: kyaml keeps its OpenAPI schema in package globals that it
// initialises and swaps without a lock (openapi.initSchema), so two renders at once race (seen in
// CI under -race when the overlay tests ran in parallel).
var renderMu sync.Mutex

// Render builds the kustomization in dir (absolute) as `kubectl apply -k` would and returns one
// Doc per object.
func Render(dir string) ([]Doc, error) {
	if _, err := os.Stat(filepath.Join(dir, "kustomization.yaml")); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("render %s: no kustomization.yaml there (the overlay is missing)", dir)
		}
		return nil, fmt.Errorf("render %s: %w", dir, err)
	}
	renderMu.Lock()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), dir)
	renderMu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("render %s: %w", dir, err)
	}
	docs := make([]Doc, 0, m.Size())
	for _, r := range m.Resources() {
		y, err := r.AsYAML()
		if err != nil {
			return nil, fmt.Errorf("render %s: %s as YAML: %w", dir, r.CurId(), err)
		}
		docs = append(docs, Doc{YAML: bytes.Clone(y)})
	}
	return docs, nil
}
