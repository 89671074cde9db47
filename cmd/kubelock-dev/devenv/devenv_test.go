package devenv

import (
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func TestCheck(t *testing.T) {
	assets := t.TempDir()
	for _, b := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kubectl"} {
		if err := os.WriteFile(filepath.Join(assets, b), []byte("#!/bin/sh\n"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	taken := ln.Addr().(*net.TCPAddr).Port //nolint:errcheck // a TCP listener's address

	base := func() Options {
		o := DefaultOptions()
		o.AssetsDir = assets
		o.APIServerPort, o.EtcdPort, o.EtcdPeerPort, o.WebhookPort = 1, 2, 3, 4 // not checked: see below
		return o
	}
	for _, tc := range []struct {
		name string
		edit func(*Options)
		want string
	}{
		{"missing binaries", func(o *Options) { o.AssetsDir = t.TempDir() }, "no etcd binary at "},
		{"missing binaries name the build", func(o *Options) { o.AssetsDir = t.TempDir() }, "`make control-plane`"},
		{"taken port", func(o *Options) { o.WebhookPort = taken }, "is already in use"},
		{"taken port names its flag", func(o *Options) { o.WebhookPort = taken }, "choose another port with --webhook-port"},
		{"duplicate ports", func(o *Options) { o.EtcdPort = o.APIServerPort }, "--apiserver-port and --etcd-port are both"},
		{"port out of range", func(o *Options) { o.EtcdPeerPort = 70000 }, "--etcd-peer-port must be in 1..65535"},
		{"empty data dir", func(o *Options) { o.Dir = "" }, "--data-dir must not be empty"},
		{"unknown admission engine", func(o *Options) { o.Admission = "opa" }, `--admission must be "webhook" or "policy", got "opa"`},
		{"unknown backend", func(o *Options) { o.Backend = "etcd" }, `--backend must be "crd" or "apiserver", got "etcd"`},
		{"apiserver backend without the node", func(o *Options) { o.Backend = BackendAPIServer }, "--backend apiserver runs kubelock-apiserver and its etcd as pods: only with --node"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := base()
			// Ports 1..4 need privileges to listen on; give the ones the case
			// does not set free ports of their own.
			for _, p := range []*int{&o.APIServerPort, &o.EtcdPort, &o.EtcdPeerPort, &o.WebhookPort} {
				if *p <= 4 {
					*p = freePort(t)
				}
			}
			tc.edit(&o)
			e := &env{o: o}
			err := e.check()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("check() = %v, want an error with %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("the error is not one line: %q", err)
			}
		})
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().(*net.TCPAddr).Port //nolint:errcheck // a TCP listener's address
}

func TestShellQuote(t *testing.T) {
	for in, want := range map[string]string{
		"/a/b/.kubelock/dev/kubeconfig": "/a/b/.kubelock/dev/kubeconfig",
		"/a b/kubeconfig":               "'/a b/kubeconfig'",
		"/it's":                         `'/it'\''s'`,
		"":                              "''",
	} {
		if got := shellQuote(in); got != want {
			t.Errorf("shellQuote(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestFindKubelock(t *testing.T) {
	dir := t.TempDir()
	self := filepath.Join(dir, "kubelock-dev")
	t.Setenv("PATH", t.TempDir())
	if _, err := findKubelock(self); err == nil || !strings.Contains(err.Error(), "`make kubelock`") {
		t.Errorf("without a kubelock: %v, want an error naming make kubelock", err)
	}
	onPath := filepath.Join(t.TempDir(), "kubelock")
	if err := os.WriteFile(onPath, []byte("#!/bin/sh\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", filepath.Dir(onPath))
	if got, err := findKubelock(self); err != nil || got != onPath {
		t.Errorf("with kubelock on PATH: %q, %v, want %q", got, err, onPath)
	}
	next := filepath.Join(dir, "kubelock")
	if err := os.WriteFile(next, []byte("#!/bin/sh\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	if got, err := findKubelock(self); err != nil || got != next {
		t.Errorf("with kubelock next to kubelock-dev: %q, %v, want %q (before PATH)", got, err, next)
	}
}

func TestMainUsage(t *testing.T) {
	for _, args := range [][]string{{"kubelock-dev", "--no-such-flag"}, {"kubelock-dev", "extra"}, {"kubelock-dev", "--admission", "opa"}} {
		var out, errOut strings.Builder
		if code := Main(args, &out, &errOut); code != exitUsage {
			t.Errorf("%q: exit %d, want %d", args, code, exitUsage)
		}
		if got := errOut.String(); !strings.HasPrefix(got, "kubelock-dev: ") || strings.Count(got, "\n") != 1 {
			t.Errorf("%q: stderr %q, want one kubelock-dev: line", args, got)
		}
	}
	var out, errOut strings.Builder
	if code := Main([]string{"kubelock-dev", "--help"}, &out, &errOut); code != 0 {
		t.Errorf("--help: exit %d", code)
	}
	for _, flag := range []string{"--kubeconfig-out", "--data-dir", "--persist", "--assets-dir", "--apiserver-port", "--etcd-port", "--etcd-peer-port", "--webhook-port", "--probe-port", "--metrics-port", "--start-timeout", "--admission"} {
		if !strings.Contains(out.String(), flag) {
			t.Errorf("--help does not list %s", flag)
		}
	}
}

// TestPolicyObjects checks what --admission policy applies: config/policy's
// policies and bindings, the controller's user in each policy that names one.
func TestPolicyObjects(t *testing.T) {
	objs, err := policyObjects("kubelock-dev-controller")
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	controllerUsers := 0
	for _, o := range objs {
		kinds[o.GetKind()]++
		vars, _, _ := unstructured.NestedSlice(o.Object, "spec", "variables")
		for _, v := range vars {
			if m, _ := v.(map[string]any); m["name"] == "controllerUser" {
				controllerUsers++
				if m["expression"] != `"kubelock-dev-controller"` {
					t.Errorf("%s: controllerUser is %v", o.GetName(), m["expression"])
				}
			}
		}
	}
	if want := map[string]int{"ValidatingAdmissionPolicy": 3, "ValidatingAdmissionPolicyBinding": 3}; !maps.Equal(kinds, want) {
		t.Errorf("objects by kind %v, want %v", kinds, want)
	}
	if controllerUsers != 2 {
		t.Errorf("%d policies name the controller, want 2 (locks and sessions)", controllerUsers)
	}
}

// TestFencedWebhookOnly checks the Deployment --node applies with the policy
// engine: the certificate rotation keeps the fenced-objects webhook's caBundle.
func TestFencedWebhookOnly(t *testing.T) {
	d := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"template": map[string]any{"spec": map[string]any{
		"containers": []any{map[string]any{"name": "manager", "args": []any{"--leader-elect=true", "--webhook-config-name=kubelock-validating-webhook-configuration"}}},
	}}}}}
	if err := fencedWebhookOnly(d); err != nil {
		t.Fatal(err)
	}
	cs, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	got := cs[0].(map[string]any)["args"] //nolint:errcheck // built above
	want := []any{"--leader-elect=true", "--webhook-config-name=" + FencedWebhookConfigName, "--fenced-webhook-config-name="}
	if !slices.Equal(got.([]any), want) { //nolint:errcheck // built above
		t.Errorf("args %v, want %v", got, want)
	}
}
