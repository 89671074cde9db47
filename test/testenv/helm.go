package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

// Helm is the helm binary tests run: $HELM (make sets it), else the newest
// one `make helm` built into bin/.
func Helm() (string, error) {
	path := os.Getenv("HELM")
	if path == "" {
		found, _ := filepath.Glob(filepath.Join(RepoRoot(), "bin", "helm-v*"))
		sort.Strings(found)
		if len(found) > 0 {
			path = found[len(found)-1]
		}
	}
	if _, err := os.Stat(path); path == "" || err != nil {
		return "", fmt.Errorf("no helm binary (%q): build it with `make helm` (make test does)", path)
	}
	return path, nil
}
