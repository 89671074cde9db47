package lockapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/cmd/kubelock/cli"
	"github.com/kubelock/kubelock/internal/localcluster"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/lockapi"
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
		holdDirect(t, ns, "by-certificate", cert, server.Direct(cert), "alice")
	})
	t.Run("service account token", func(t *testing.T) {
		token := serviceAccountToken(t, ns, "worker")
		holdDirect(t, ns, "by-token", token, server.Direct(token), "system:serviceaccount:"+ns+":worker")
	})
}

// holdDirect takes, renews and releases lock name with a NewDirect client
// of kube-apiserver (kube) and the lock apiserver (lockAPI), whose requests
// are logged apart, and checks that every lock request went straight to the
// lock apiserver, and the holding was user's.
func holdDirect(t *testing.T, ns, name string, kube, lockAPI *rest.Config, user string) {
	ctx := t.Context()
	viaKube, direct := &requestLog{}, &requestLog{}
	k, d := rest.CopyConfig(kube), rest.CopyConfig(lockAPI)
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

// A client finds the lock server as kube-apiserver does (lock.FindServer,
// kubelock --lock-server=auto): the chart's grant to every authenticated
// user lets it read the APIService, which names the Service and the CA, and
// the Service, whose cluster IP it then reaches (here through a dialer that
// does what kube-proxy does on a node) trusting only that CA, for the
// Service's DNS name. Without the grant it is told what it could not read.
func TestLockServerIsFoundFromTheAPIService(t *testing.T) {
	ctx := t.Context()
	ns := namespace(t)
	token := serviceAccountToken(t, ns, "finder")
	user := "system:serviceaccount:" + ns + ":finder"
	if _, err := lock.FindServer(ctx, token); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "APIService "+locksv1alpha1.APIServiceName) {
		t.Fatalf("finding the lock server without the chart's grant: %v, want forbidden, naming the APIService", err)
	}

	applyChartTemplate(t, "templates/apiserver/lock-server-discovery.yaml")
	// The grant reaches kube-apiserver's authorizer through its informers.
	var lockAPI *rest.Config
	var err error
	if werr := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		lockAPI, err = lock.FindServer(ctx, token)
		return err == nil, nil
	}); werr != nil {
		t.Fatalf("finding the lock server with the chart's grant: %v", err)
	}
	svc := &corev1.Service{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: lockapi.Namespace, Name: server.Name}, svc); err != nil {
		t.Fatal(err)
	}
	clusterIP := net.JoinHostPort(svc.Spec.ClusterIP, "443")
	if lockAPI.Host != "https://"+clusterIP || lockAPI.ServerName != server.Name+"."+lockapi.Namespace+".svc" ||
		!bytes.Equal(lockAPI.CAData, server.CA) || lockAPI.Insecure || lockAPI.BearerToken != token.BearerToken {
		t.Fatalf("lock server %s (server name %q, CA of %d bytes, insecure %v), want https://%s for %s.%s.svc with the APIService's CA and the user's token",
			lockAPI.Host, lockAPI.ServerName, len(lockAPI.CAData), lockAPI.Insecure, clusterIP, server.Name, lockapi.Namespace)
	}
	replica := strings.TrimPrefix(server.URL(), "https://")
	lockAPI.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if addr != clusterIP {
			return nil, fmt.Errorf("dialed %s, want the Service's cluster IP %s", addr, clusterIP)
		}
		var d net.Dialer
		return d.DialContext(ctx, network, replica)
	}
	holdDirect(t, ns, "found", token, lockAPI, user)
}

// applyChartTemplate creates the objects of one of the chart's templates,
// rendered for the apiserver backend in the lock apiserver's namespace,
// and deletes them when the test ends.
func applyChartTemplate(t *testing.T, template string) {
	t.Helper()
	helm, err := testenv.Helm()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(t.Context(), helm, "template", "kubelock", filepath.Join(testenv.RepoRoot(), "dist", "chart"),
		"--namespace", lockapi.Namespace, "--set", "backend=apiserver", "--show-only", template).Output()
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	for {
		obj := &unstructured.Unstructured{}
		if err := dec.Decode(&obj.Object); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if len(obj.Object) == 0 {
			continue
		}
		if err := env.Client.Create(t.Context(), obj); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), obj) })
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

	// auto takes the CA from the APIService, never from a file.
	if _, err := kubelock("--lock-server", "auto", "--lock-server-ca", ca, "acquire", "cli", "--create", "--wait", "0"); err == nil || !strings.Contains(err.Error(), "--lock-server-ca is for a --lock-server URL") {
		t.Errorf("acquire with --lock-server=auto and a CA file: %v, want a usage error", err)
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
