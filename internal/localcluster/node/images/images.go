// Package images writes the container images kubelock-dev --node imports into
// its containerd, without Docker: each is one static binary on an empty base
// that carries only CA certificates and a nonroot user (as the Dockerfile's
// images), written as a docker-archive tarball for `ctr images import`. Only
// kubelock-dev links it, so pkg/lock and the CLI never depend on an image library.
package images

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path"
	"runtime"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Image is one image: each of Binaries (static executables on this machine)
// becomes /<its base name>; the first is the entrypoint.
type Image struct {
	Ref      string
	Binaries []string
	// User is the image's user ("65532:65532" when empty; "0" for root).
	User string
}

// WriteArchive writes imgs, for this machine's platform, into one
// docker-archive tarball at file.
func WriteArchive(file string, imgs ...Image) error {
	refs := map[name.Reference]v1.Image{}
	for _, im := range imgs {
		ref, err := name.ParseReference(im.Ref)
		if err != nil {
			return err
		}
		img, err := build(im)
		if err != nil {
			return fmt.Errorf("image %s: %w", im.Ref, err)
		}
		refs[ref] = img
	}
	return tarball.MultiRefWriteToFile(file, refs)
}

func build(im Image) (v1.Image, error) {
	layer, err := rootfs(im.Binaries)
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	// containerd's import drops an image without a platform; the pod runs the entrypoint.
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config.Entrypoint = []string{"/" + path.Base(im.Binaries[0])}
	cf.Config.User = im.User
	if cf.Config.User == "" {
		cf.Config.User = "65532:65532"
	}
	cf.Config.Env = []string{"PATH=/"}
	return mutate.ConfigFile(img, cf)
}

// rootfs is the image's one layer: the binaries, /etc/passwd and /etc/group
// with root and nonroot, a world-writable /tmp and the machine's CA certificates.
func rootfs(binaries []string) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	now := time.Unix(0, 0)
	add := func(name string, mode int64, data []byte) error {
		h := &tar.Header{Name: name, Mode: mode, Size: int64(len(data)), ModTime: now, Typeflag: tar.TypeReg}
		if data == nil {
			h.Typeflag = tar.TypeDir
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	type file struct {
		name string
		mode int64
		data []byte // nil: a folder
	}
	files := []file{
		{"etc/", 0o755, nil},
		{"etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{"etc/group", 0o644, []byte("root:x:0:\nnonroot:x:65532:\n")},
		{"tmp/", 0o1777, nil},
	}
	if certs, err := os.ReadFile("/etc/ssl/certs/ca-certificates.crt"); err == nil {
		files = append(files, file{"etc/ssl/certs/ca-certificates.crt", 0o644, certs})
	}
	for _, b := range binaries {
		data, err := os.ReadFile(b)
		if err != nil {
			return nil, err
		}
		files = append(files, file{path.Base(b), 0o755, data})
	}
	for _, f := range files {
		if err := add(f.name, f.mode, f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
}
