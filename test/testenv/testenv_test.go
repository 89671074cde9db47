package testenv

import (
	"context"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// TestStart checks what the suites rely on: the options' flags reach etcd
// and kube-apiserver, Config is envtest's admin, users added are who they
// say, kubectl runs as one, and the CRDs are installed.
func TestStart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env, err := Start(WithEtcdArgs("max-request-bytes", "131072"), WithAPIServerArgs("max-requests-inflight", "123"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := env.Stop(); err != nil {
			t.Error(err)
		}
	}()
	if got := whoAmI(ctx, t, env.Config); got != adminUser {
		t.Errorf("Config authenticates as %q, want %q", got, adminUser)
	}
	u, err := env.AddUser(envtest.User{Name: "alice", Groups: []string{"team-a"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := whoAmI(ctx, t, u.Config()); got != "alice" {
		t.Errorf("an added user authenticates as %q, want alice", got)
	}
	kubectl, err := env.Kubectl("kubectl-admin")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := kubectl("get", "crd", "distributedlocks.locks.kubelock.io", "-o", "name"); err != nil || !strings.Contains(out, "distributedlocks.locks.kubelock.io") {
		t.Errorf("kubectl get crd: %q, %v", out, err)
	}
	for _, c := range []struct{ component, flag string }{
		{"etcd", "--max-request-bytes=131072"},
		{"kube-apiserver", "--max-requests-inflight=123"},
		{"kube-apiserver", "--disable-admission-plugins=ServiceAccount"},
	} {
		if !hasFlag(env, c.component, c.flag) {
			t.Errorf("%s runs without %s", c.component, c.flag)
		}
	}
	if env.ControlPlane.Etcd.URL.String() != env.Cluster.Etcd.Members[0].ClientURL {
		t.Errorf("ControlPlane.Etcd.URL is %s, want etcd's %s", env.ControlPlane.Etcd.URL, env.Cluster.Etcd.Members[0].ClientURL)
	}
}

func whoAmI(ctx context.Context, t *testing.T, cfg *rest.Config) string {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return r.Status.UserInfo.Username
}

// hasFlag says whether the component named name runs with flag.
func hasFlag(env *Env, name, flag string) bool {
	for _, c := range env.Cluster.Components() {
		if c.Name == name {
			for _, a := range c.Args {
				if a == flag {
					return true
				}
			}
		}
	}
	return false
}
