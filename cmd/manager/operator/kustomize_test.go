package operator

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubelock/kubelock/test/testenv"
)

// TestKustomizeConfig renders config/default (self-rotating webhook) and an
// overlay with the certmanager component, checks what each wires up, and lets
// the real apiserver validate config/default with a server-side dry run.
func TestKustomizeConfig(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane")
	}
	kubectl := filepath.Join(testenv.AssetsDir(), "kubectl")
	if _, err := os.Stat(kubectl); err != nil {
		t.Skipf("no kubectl in the control-plane build: %v", err)
	}
	root := testenv.RepoRoot()
	render := func(dir string) string {
		t.Helper()
		out, err := exec.Command(kubectl, "kustomize", dir).CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, out)
		}
		return string(out)
	}

	self := render(filepath.Join(root, "config", "default"))
	for _, want := range []string{
		"name: kubelock-validating-webhook-configuration",
		"name: kubelock-webhook-service\n      namespace: kubelock-system\n      path: /validate-locks-kubelock-io-v1alpha1-distributedlock",
		"failurePolicy: Fail", "sideEffects: None",
		"name: kubelock-webhook-server-cert", "name: kubelock-cert-rotation",
		"--cert-rotation=true", "containerPort: 9443", "emptyDir:",
		// Quiet servers: metrics over HTTPS for the reader role only, and the
		// webhook configurations and Secret the operator writes named.
		"--metrics-secure=true", "name: kubelock-metrics-reader", "- /metrics",
		"resourceNames:\n  - kubelock-fenced-objects\n  - kubelock-validating-webhook-configuration",
		"resourceNames:\n  - kubelock-webhook-server-cert",
	} {
		if !strings.Contains(self, want) {
			t.Errorf("config/default lacks %q", want)
		}
	}

	// An overlay with the component, as a user would write it.
	overlay := t.TempDir()
	rel := func(p string) string {
		r, err := filepath.Rel(overlay, filepath.Join(root, "config", p))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	must(t, os.WriteFile(filepath.Join(overlay, "kustomization.yaml"),
		[]byte("resources:\n- "+rel("default")+"\ncomponents:\n- "+rel("certmanager")+"\n"), 0o600))
	cm := render(overlay)
	for _, want := range []string{
		"kind: Issuer", "kind: Certificate", "cert-manager.io/inject-ca-from: kubelock-system/kubelock-serving-cert",
		"--cert-rotation=false", "secretName: kubelock-webhook-server-cert",
		"- kubelock-webhook-service.kubelock-system.svc\n",
	} {
		if !strings.Contains(cm, want) {
			t.Errorf("config/default with config/certmanager lacks %q", want)
		}
	}
	for _, gone := range []string{"name: kubelock-cert-rotation", "kind: Secret\n", "emptyDir:"} {
		if strings.Contains(cm, gone) {
			t.Errorf("config/default with config/certmanager still has %q", gone)
		}
	}

	// Overlays with the optional components, as a user would write them.
	withAPF := overlayWith(t, root, []string{"default"}, "apf", "policy", "fenced-objects")
	apf := render(withAPF)
	for _, want := range []string{
		"kind: FlowSchema", "kind: PriorityLevelConfiguration", "name: kubelock-controller-manager\n        namespace: kubelock-system",
		"kind: ValidatingAdmissionPolicy\n", "kind: ValidatingAdmissionPolicyBinding", "name: kubelock-fenced-objects",
	} {
		if !strings.Contains(apf, want) {
			t.Errorf("config/default with config/apf, config/policy and config/fenced-objects lacks %q", want)
		}
	}

	env, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	// A server-side dry run does not create the namespace the rest lives in.
	must(t, env.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kubelock-system"}}))
	kctl, err := env.Kubectl("kustomize-admin")
	if err != nil {
		t.Fatal(err)
	}
	dryRun := func(name, manifest string) {
		t.Helper()
		file := filepath.Join(t.TempDir(), "manifest.yaml")
		must(t, os.WriteFile(file, []byte(manifest), 0o600))
		out, err := kctl("apply", "--server-side", "--dry-run=server", "-f", file)
		if err != nil {
			t.Fatalf("the apiserver rejects %s: %v\n%s", name, err, out)
		}
		t.Logf("server-side dry run of %s:\n%s", name, out)
	}
	dryRun("config/default", self)
	dryRun("config/default with config/apf, config/policy and config/fenced-objects", apf)

	// cert-manager's kinds need its CRDs; stand-ins that accept any content
	// let the apiserver check everything else the component changes.
	stub := filepath.Join(t.TempDir(), "cert-manager-crds.yaml")
	var crds strings.Builder
	for _, k := range [][2]string{{"Issuer", "issuers"}, {"Certificate", "certificates"}} {
		crds.WriteString(testenv.StandInCRD("cert-manager.io", k[0], k[1]))
	}
	must(t, os.WriteFile(stub, []byte(crds.String()), 0o600))
	if out, err := kctl("apply", "-f", stub); err != nil {
		t.Fatalf("stand-in cert-manager CRDs: %v\n%s", err, out)
	}
	if out, err := kctl("wait", "--for=condition=Established", "--timeout=60s", "crd/issuers.cert-manager.io", "crd/certificates.cert-manager.io"); err != nil {
		t.Fatalf("stand-in cert-manager CRDs: %v\n%s", err, out)
	}
	dryRun("config/default with config/certmanager", cm)
}

// overlayWith writes a kustomization with the given config/ folders as
// resources and components, and returns its folder.
func overlayWith(t *testing.T, root string, resources []string, components ...string) string {
	t.Helper()
	dir := t.TempDir()
	var b strings.Builder
	list := func(key string, names []string) {
		if len(names) == 0 {
			return
		}
		b.WriteString(key + ":\n")
		for _, n := range names {
			r, err := filepath.Rel(dir, filepath.Join(root, "config", n))
			if err != nil {
				t.Fatal(err)
			}
			b.WriteString("- " + r + "\n")
		}
	}
	list("resources", resources)
	list("components", components)
	must(t, os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(b.String()), 0o600))
	return dir
}
