package node

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/kubelock/kubelock/internal/localcluster/node/images"
)

// buildImages builds the images' packages and the pause image's as static
// binaries from the module, in one go build, and writes them as one archive.
func (n *Node) buildImages(ctx context.Context) error {
	started := time.Now()
	dir := n.dir("images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	all := append(append([]Image(nil), n.o.Images...), Image{Ref: PauseImage, Packages: []string{pausePackage}})
	pkgs, refs := map[string]bool{}, []string(nil)
	args := []string{"build", "-trimpath", "-ldflags=-s -w", "-o", dir + "/"}
	for _, im := range all {
		refs = append(refs, im.Ref)
		for _, p := range im.Packages {
			if !pkgs[p] {
				pkgs[p] = true
				args = append(args, p)
			}
		}
	}
	build := exec.CommandContext(ctx, "go", args...)
	build.Dir = n.o.Module
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("building the images' binaries: %w: %s", err, out)
	}
	var imgs []images.Image
	for _, im := range all {
		img := images.Image{Ref: im.Ref}
		for _, p := range im.Packages {
			img.Binaries = append(img.Binaries, filepath.Join(dir, path.Base(p))) // go build's name for it
		}
		img.Binaries = append(img.Binaries, im.Binaries...)
		imgs = append(imgs, img)
	}
	n.archive = filepath.Join(dir, "images.tar")
	if err := images.WriteArchive(n.archive, imgs...); err != nil {
		return fmt.Errorf("writing the images: %w", err)
	}
	n.o.Progress("built images %s from the checkout in %s", joinComma(refs), time.Since(started).Round(10*time.Millisecond))
	return nil
}

// joinComma is for the images' progress line.
func joinComma(refs []string) string {
	if len(refs) < 2 {
		return strings.Join(refs, "")
	}
	return strings.Join(refs[:len(refs)-1], ", ") + " and " + refs[len(refs)-1]
}
