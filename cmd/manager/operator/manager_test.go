package operator

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	sigsyaml "sigs.k8s.io/yaml"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/internal/proc"
	"github.com/kubelock/kubelock/test/testenv"
)

func TestHelpListsEveryFlag(t *testing.T) {
	var out bytes.Buffer
	if code := Main([]string{"--help"}, &out); code != 0 {
		t.Fatalf("--help exited %d", code)
	}
	for _, flag := range []string{
		"metrics-bind-address", "metrics-secure", "metrics-cert-dir", "webhook-client-ca-file", "health-probe-bind-address", "pprof-bind-address", "leader-elect", "leader-election-namespace", "leader-election-lock", "leader-election-service-account",
		"leader-election-id", "expiry-grace", "auto-created-idle-timeout", "controller-username",
		"concurrency", "events", "kubeconfig", "zap-log-level",
		"enable-webhook", "webhook-port", "webhook-cert-dir", "webhook-controller-users", "cert-rotation",
		"cert-secret-name", "cert-secret-namespace", "webhook-service-name", "webhook-config-name", "fenced-webhook-config-name", "cert-extra-dns-names",
		"lock-apiserver-service-name", "lock-apiserver-cert-secret-name", "lock-apiserver-cert-dir",
	} {
		if !strings.Contains(out.String(), "-"+flag) {
			t.Errorf("--help does not document --%s:\n%s", flag, out.String())
		}
	}
}

func TestInvalidFlagsAreRejectedUpFront(t *testing.T) {
	for _, args := range [][]string{
		{"--expiry-grace=-1s"},
		{"--auto-created-idle-timeout=0"},
		{"--concurrency=0"},
		{"--events=none"},
		{"--events=All"},
		{"--leader-election-id="},
		{"--no-such-flag"},
		{"--webhook-port=0"},
		{"--webhook-port=70000"},
		{"--webhook-cert-dir="},
		{"--cert-secret-name="},
		{"--webhook-config-name="},
		{"--leader-election-lock=configmap"},
		{"--leader-election-lock=kubelock", "--leader-election-lease-duration=12s"},
		{"--lock-apiserver-service-name=kubelock-apiserver", "--lock-apiserver-cert-secret-name="},
		{"--lock-apiserver-service-name=kubelock-apiserver", "--lock-apiserver-cert-dir="},
	} {
		var out bytes.Buffer
		if code := Main(args, &out); code != 2 {
			t.Errorf("Main(%q) exited %d, want 2; output:\n%s", args, code, out.String())
		}
	}
}

// TestRunElectsLeaderAndReconciles runs the operator as the binary does, with
// leader election and probes, against a real control plane.
func TestRunElectsLeaderAndReconciles(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane")
	}
	if inOwnProcess(t) {
		return
	}
	env := startLogged(t)

	opts := DefaultOptions()
	opts.MetricsAddr = freeAddr(t) // HTTPS with authn/authz, the default
	opts.ProbeAddr = freeAddr(t)
	opts.LeaderElectionNamespace = "default"
	opts.EnableWebhook = false // TestWebhook* cover it
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, env.Config, opts) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})

	poll := func(what string, cond func(context.Context) (bool, error)) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, cond); err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
	}
	poll("/healthz and /readyz", func(context.Context) (bool, error) {
		for _, path := range []string{"/healthz", "/readyz"} {
			resp, err := http.Get(fmt.Sprintf("http://%s%s", opts.ProbeAddr, path))
			if err != nil {
				return false, nil //nolint:nilerr // not listening yet: keep polling
			}
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return false, nil
			}
		}
		return true, nil
	})
	poll("the leader Lease", func(ctx context.Context) (bool, error) {
		var lease coordinationv1.Lease
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: opts.LeaderElectionID}, &lease)
		return err == nil && lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity != "", nil
	})
	l := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "wired"}}
	if err := env.Client.Create(ctx, l); err != nil {
		t.Fatal(err)
	}
	// The controller leaves a never-used lock alone; a status a client wrote
	// without observedGeneration is one it brings up to date.
	meta.SetStatusCondition(&l.Status.Conditions, metav1.Condition{Type: locksv1alpha1.ConditionHeld, Status: metav1.ConditionFalse, Reason: locksv1alpha1.ReasonReleased, Message: "free"})
	if err := env.Client.Status().Update(ctx, l); err != nil {
		t.Fatal(err)
	}
	poll("the leader to reconcile a lock", func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(l), l)
		return err == nil && l.Status.ObservedGeneration == l.Generation, nil
	})

	checkMetricsNeedAuthnAndAuthz(ctx, t, env, opts.MetricsAddr, poll)
}

// checkMetricsNeedAuthnAndAuthz scrapes the manager's metrics as
// config/prometheus does (HTTPS, a service account's bearer token bound to
// config/rbac's kubelock-metrics-reader) and checks that nobody else gets them.
func checkMetricsNeedAuthnAndAuthz(ctx context.Context, t *testing.T, env *testenv.Env, addr string, poll func(string, func(context.Context) (bool, error))) {
	t.Helper()
	role := &rbacv1.ClusterRole{}
	readManifest(t, filepath.Join("config", "rbac", "metrics_reader_role.yaml"), role)
	must(t, env.Client.Create(ctx, role))
	token := func(sa string) string {
		t.Helper()
		must(t, env.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: sa}}))
		cs, err := kubernetes.NewForConfig(env.Config)
		must(t, err)
		tr, err := cs.CoreV1().ServiceAccounts("default").CreateToken(ctx, sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		must(t, err)
		return tr.Status.Token
	}
	scraper, other := token("scraper"), token("not-a-scraper")
	must(t, env.Client.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "scraper-reads-metrics"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "default", Name: "scraper"}},
	}))
	url := "https://" + addr + "/metrics"
	// The certificate is self-signed, as config/prometheus' insecureSkipVerify expects.
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // self-signed on purpose
	scrape := func(bearer string) (int, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		must(t, err)
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer func() { _ = resp.Body.Close() }()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	var body string
	poll("metrics for the scraper's token", func(context.Context) (bool, error) {
		var code int
		code, body = scrape(scraper)
		return code == http.StatusOK, nil
	})
	if !strings.Contains(body, "kubelock_controller_is_leader 1") {
		t.Errorf("the scraper's metrics lack kubelock_controller_is_leader 1:\n%.2000s", body)
	}
	for _, c := range []struct {
		who    string
		bearer string
		want   int
	}{
		{"no token", "", http.StatusUnauthorized},
		// The TokenReview of a token that is no JWT errors: controller-runtime answers 500.
		{"a forged token", "forged", 0},
		{"a token without the role", other, http.StatusForbidden},
	} {
		if code, body := scrape(c.bearer); (c.want != 0 && code != c.want) || code < 400 || strings.Contains(body, "kubelock_") {
			t.Errorf("metrics with %s: got %d %.200q, want %d without metrics", c.who, code, body, c.want)
		}
	}
	if code, body := get("http://" + addr + "/metrics"); code == http.StatusOK || strings.Contains(body, "kubelock_") {
		t.Errorf("metrics over plain HTTP: got %d %.200q, want no metrics", code, body)
	}
}

// readManifest decodes the one object in file (under the repository root).
func readManifest(t *testing.T, file string, into any) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), file))
	must(t, err)
	must(t, sigsyaml.Unmarshal(data, into))
}

// inOwnProcess runs the calling test again, alone, in a child process of this
// test binary and reports whether it did (the caller then returns): each
// test that starts the operator needs a process of its own, since
// controller-runtime allows one controller of a name per process.
func inOwnProcess(t *testing.T) bool {
	t.Helper()
	const child = "KUBELOCK_TEST_CHILD"
	if os.Getenv(child) == t.Name() {
		return false
	}
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^"+t.Name()+"$", "-test.v")
	cmd.Env = append(os.Environ(), child+"="+t.Name())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return true
}

// freeAddr is a loopback address nothing listens on, reserved for this
// process.
func freeAddr(t *testing.T) string {
	t.Helper()
	p, err := proc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
}

// syncBuffer keeps the logs, shown only when the test fails.
// startLogged starts a control plane for t, and sends the manager's logs to
// t's log when t fails.
func startLogged(t *testing.T) *testenv.Env {
	t.Helper()
	logs := &syncBuffer{}
	ctrl.SetLogger(zap.New(zap.WriteTo(logs), zap.UseDevMode(true)))
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(logs.String())
		}
	})
	env, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	return env
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
