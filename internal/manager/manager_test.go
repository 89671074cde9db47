package manager

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/internal/testenv"
)

func TestHelpListsEveryFlag(t *testing.T) {
	var out bytes.Buffer
	if code := Main([]string{"--help"}, &out); code != 0 {
		t.Fatalf("--help exited %d", code)
	}
	for _, flag := range []string{
		"metrics-bind-address", "health-probe-bind-address", "leader-elect", "leader-election-namespace",
		"leader-election-id", "expiry-grace", "auto-created-idle-timeout", "controller-username",
		"concurrency", "kubeconfig", "zap-log-level",
		"enable-webhook", "webhook-port", "webhook-cert-dir", "webhook-controller-users", "cert-rotation",
		"cert-secret-name", "cert-secret-namespace", "webhook-service-name", "webhook-config-name", "fenced-webhook-config-name", "cert-extra-dns-names",
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
		{"--leader-election-id="},
		{"--no-such-flag"},
		{"--webhook-port=0"},
		{"--webhook-port=70000"},
		{"--webhook-cert-dir="},
		{"--cert-secret-name="},
		{"--webhook-config-name="},
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

	opts := DefaultOptions()
	opts.MetricsAddr = "0"
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
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().String()
}

// syncBuffer keeps the logs, shown only when the test fails.
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
