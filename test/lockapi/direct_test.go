package lockapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubelock/kubelock/cmd/kubelock/cli"
	"github.com/kubelock/kubelock/internal/localcluster"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/testenv"
)

// A client of the lock apiserver's Service (lock.NewDirect) takes, renews
// and releases locks without kube-apiserver proxying them, as the user it
// authenticates as: a client certificate checked against kube-apiserver's
// client CA, and a service account's token checked with a TokenReview.
func TestDirectClientsHoldLocksAsThemselves(t *testing.T) {
	ns := namespace(t)
	cert, err := env.UserConfig(t.Context(), "alice")
	if err != nil {
		t.Fatal(err)
	}
	t.Run("client certificate", func(t *testing.T) {
		holdDirect(t, ns, "by-certificate", cert, "alice")
	})
	t.Run("service account token", func(t *testing.T) {
		token := serviceAccountToken(t, ns, "worker")
		holdDirect(t, ns, "by-token", token, "system:serviceaccount:"+ns+":worker")
	})
}

// holdDirect takes, renews and releases lock name with a NewDirect client
// whose requests to kube-apiserver (kube) and to the lock apiserver are
// logged apart, and checks that every lock request went straight to the
// lock apiserver, and the holding was user's.
func holdDirect(t *testing.T, ns, name string, kube *rest.Config, user string) {
	ctx := t.Context()
	viaKube, direct := &requestLog{}, &requestLog{}
	k, d := rest.CopyConfig(kube), server.Direct(kube)
	k.Wrap(func(rt http.RoundTripper) http.RoundTripper { return viaKube.wrap(rt) })
	d.Wrap(func(rt http.RoundTripper) http.RoundTripper { return direct.wrap(rt) })
	c, err := lock.NewDirect(k, d, lock.WithNamespace(ns), lock.WithIdentity("direct-0"), lock.WithoutAutoRenew(), lock.WithAutoCreate())
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if h := get(t, ns, name).Status.Holder; h == nil || h.LeaseID != l.LeaseID() || h.User != user {
		t.Fatalf("stored holder %+v, want lease %s of %s", h, l.LeaseID(), user)
	}
	if err := l.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	writes := 0
	for _, r := range direct.lockRequests() {
		if strings.HasPrefix(r, http.MethodPut+" ") && strings.HasSuffix(r, "/"+name+"/status") {
			writes++
		}
	}
	if writes < 3 {
		t.Errorf("the lock apiserver saw %d status writes of %s (%v), want the acquisition, the renewal and the release", writes, name, direct.lockRequests())
	}
	if got := viaKube.lockRequests(); len(got) != 0 {
		t.Errorf("kube-apiserver was sent lock requests %v, want none", got)
	}
	if !slices.ContainsFunc(viaKube.all(), func(r string) bool { return strings.HasSuffix(r, "/selfsubjectreviews") }) {
		t.Errorf("kube-apiserver was sent %v, want the SelfSubjectReview", viaKube.all())
	}
}

// serviceAccountToken is a config that presents to kube-apiserver a token of
// service account name in ns, which it binds to the lock-user role.
func serviceAccountToken(t *testing.T, ns, name string) *rest.Config {
	t.Helper()
	ctx := t.Context()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: testenv.LockUserRole},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}}}
	for _, o := range []client.Object{sa, binding} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return &rest.Config{Host: env.Config.Host, BearerToken: tr.Status.Token, TLSClientConfig: rest.TLSClientConfig{CAData: env.Config.CAData}}
}

// kubelock --lock-server sends its lock requests to the lock apiserver it
// names, trusting the CA --lock-server-ca names: acquire and release go
// through, and the same commands fail when the flags point elsewhere.
func TestCLIWithLockServer(t *testing.T) {
	ctx := t.Context()
	ns := namespace(t)
	cfg, err := env.UserConfig(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	kubeconfig, ca := filepath.Join(dir, "alice.kubeconfig"), filepath.Join(dir, "lock-server-ca.pem")
	if err := localcluster.WriteKubeconfig(kubeconfig, cfg); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ca, server.CA, 0o600); err != nil {
		t.Fatal(err)
	}
	// Each command within 10 s: the one whose lock server does not answer
	// would retry for its release's whole budget.
	kubelock := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		var out, errOut bytes.Buffer
		base := []string{"kubelock", "--kubeconfig", kubeconfig, "-n", ns, "--identity", "alice-cli"}
		code := cli.Run(ctx, append(base, args...), genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
		if code != 0 {
			return out.String(), fmt.Errorf("kubelock %s: exit %d: %s", strings.Join(args, " "), code, errOut.String())
		}
		return out.String(), nil
	}

	// No CA for the lock server: its certificate is not trusted.
	if _, err := kubelock("--lock-server", server.URL(), "acquire", "cli", "--create", "--wait", "0"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("acquire with a lock server whose CA is not given: %v, want a certificate error", err)
	}
	out, err := kubelock("--lock-server", server.URL(), "--lock-server-ca", ca, "acquire", "cli", "--create", "--wait", "0", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var held struct {
		LeaseID string `json:"leaseID"`
	}
	if err := json.Unmarshal([]byte(out), &held); err != nil {
		t.Fatalf("acquire printed %q: %v", out, err)
	}
	if h := get(t, ns, "cli").Status.Holder; h == nil || h.LeaseID != held.LeaseID || h.User != "alice" {
		t.Fatalf("stored holder %+v, want alice's lease %s", h, held.LeaseID)
	}
	// A lock server that does not answer: the release cannot go through.
	if _, err := kubelock("--lock-server", "https://127.0.0.1:1", "--lock-server-ca", ca, "release", "cli", "--lease-id", held.LeaseID); err == nil {
		t.Error("release through a lock server that does not answer succeeded")
	}
	if _, err := kubelock("--lock-server", server.URL(), "--lock-server-ca", ca, "release", "cli", "--lease-id", held.LeaseID); err != nil {
		t.Fatal(err)
	}
	if h := get(t, ns, "cli").Status.Holder; h != nil {
		t.Errorf("holder after the release: %+v", h)
	}
}
