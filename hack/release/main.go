// Command release builds the kubectl-lock archives that `make release`
// publishes: for each platform, kubectl-lock (the kubelock CLI under the name
// kubectl looks for) and LICENSE in a .tar.gz; SHA256SUMS over them; and the
// krew plugin manifest lock.yaml from hack/krew/lock.yaml.tmpl, naming each
// archive's address and sum. The archives are reproducible: the same commit
// and version give the same bytes (no build ID, no paths, fixed times and
// owners), so anyone can check a published sum.
package main

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"text/template"
	"time"
)

// archive is one platform's build, as the manifest names it.
type archive struct {
	OS, Arch, Name, SHA256 string
}

// semver is what krew accepts as a plugin version.
var semver = regexp.MustCompile(`^v\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$`)

func main() {
	version := flag.String("version", "", "the release's version, a semantic version with a leading v (v0.1.0)")
	url := flag.String("url", "", "where the archives are published; the manifest names <url>/<archive>")
	out := flag.String("out", "dist/release", "the directory to write the archives, SHA256SUMS and lock.yaml into")
	platforms := flag.String("platforms", "linux/amd64,linux/arm64,darwin/amd64,darwin/arm64", "comma-separated GOOS/GOARCH pairs")
	manifest := flag.String("manifest", "hack/krew/lock.yaml.tmpl", "the krew manifest's template")
	flag.Parse()
	if err := release(*version, *url, *out, *manifest, strings.Split(*platforms, ",")); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

func release(version, url, out, manifest string, platforms []string) error {
	if !semver.MatchString(version) {
		return fmt.Errorf("-version %q is not a semantic version with a leading v, as krew requires", version)
	}
	if url == "" {
		return errors.New("-url is required: the manifest names where each archive is published")
	}
	tmpl, err := template.ParseFiles(manifest)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	license, err := os.ReadFile("LICENSE")
	if err != nil {
		return err
	}
	var archives []archive
	var sums strings.Builder
	for _, p := range platforms {
		a, err := build(version, out, p, license)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		archives = append(archives, a)
		fmt.Fprintf(&sums, "%s  %s\n", a.SHA256, a.Name)
		fmt.Println("built", filepath.Join(out, a.Name))
	}
	if err := os.WriteFile(filepath.Join(out, "SHA256SUMS"), []byte(sums.String()), 0o644); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(out, "lock.yaml"))
	if err != nil {
		return err
	}
	err = tmpl.Execute(f, struct {
		Version, URL string
		Archives     []archive
	}{version, strings.TrimSuffix(url, "/"), archives})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	fmt.Println("wrote", filepath.Join(out, "SHA256SUMS"), "and", filepath.Join(out, "lock.yaml"))
	return err
}

// build compiles the CLI for platform ("linux/amd64") and packs it with the
// license into out, returning the archive's name and sum.
func build(version, out, platform string, license []byte) (archive, error) {
	goos, goarch, ok := strings.Cut(platform, "/")
	if !ok {
		return archive{}, errors.New("a platform is GOOS/GOARCH")
	}
	bin, err := os.MkdirTemp("", "kubectl-lock-")
	if err != nil {
		return archive{}, err
	}
	defer func() { _ = os.RemoveAll(bin) }()
	exe := filepath.Join(bin, "kubectl-lock")
	cmd := exec.Command("go", "build", "-trimpath", "-o", exe,
		"-ldflags", "-s -w -buildid= -X github.com/kubelock/kubelock/cmd/kubelock/cli.Version="+version,
		"./cmd/kubelock")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+goos, "GOARCH="+goarch)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return archive{}, fmt.Errorf("go build: %w", err)
	}
	program, err := os.ReadFile(exe)
	if err != nil {
		return archive{}, err
	}
	a := archive{OS: goos, Arch: goarch, Name: fmt.Sprintf("kubectl-lock_%s_%s_%s.tar.gz", version, goos, goarch)}
	f, err := os.Create(filepath.Join(out, a.Name))
	if err != nil {
		return archive{}, err
	}
	sum := sha256.New()
	err = pack(io.MultiWriter(f, sum), []entry{{"kubectl-lock", 0o755, program}, {"LICENSE", 0o644, license}})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	a.SHA256 = hex.EncodeToString(sum.Sum(nil))
	return a, err
}

type entry struct {
	name string
	mode int64
	body []byte
}

// pack writes entries as a gzipped tar with fixed times and owners.
func pack(w io.Writer, entries []entry) error {
	zw := gzip.NewWriter(w) // no name and no time in the header
	tw := tar.NewWriter(zw)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, Size: int64(len(e.body)), ModTime: time.Unix(0, 0), Format: tar.FormatUSTAR}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := tw.Write(e.body); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return zw.Close()
}
