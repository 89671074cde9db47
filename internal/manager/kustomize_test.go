package manager

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kubelock/kubelock/internal/testenv"
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

	env, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	// A server-side dry run does not create the namespace the rest lives in.
	must(t, env.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kubelock-system"}}))
	manifest := filepath.Join(t.TempDir(), "default.yaml")
	must(t, os.WriteFile(manifest, []byte(self), 0o600))
	admin, err := env.AddUser(envtest.User{Name: "kustomize-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	k, err := admin.Kubectl()
	if err != nil {
		t.Fatal(err)
	}
	k.Path = kubectl
	stdout, stderr, err := k.Run("apply", "--server-side", "--dry-run=server", "-f", manifest)
	if err != nil {
		out, _ := io.ReadAll(stdout)
		msg, _ := io.ReadAll(stderr)
		t.Fatalf("the apiserver rejects config/default: %v\n%s\n%s", err, out, msg)
	}
	out, _ := io.ReadAll(stdout)
	t.Logf("server-side dry run of config/default:\n%s", out)
}
