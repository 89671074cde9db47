package main

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/testenv"
)

// TestCBORClient runs pkg/lock over cborClient against a real kube-apiserver
// with CBORServingAndStorage on: acquire, renew, a waiter woken through its
// watch, release and a session, every answer CBOR, and the stored objects the
// same when read back as JSON. The JSON client set of the same process gets
// JSON: allowing CBOR in client-go changes nobody's default.
func TestCBORClient(t *testing.T) {
	if err := allowCBOR(); err != nil {
		t.Fatal(err)
	}
	env, err := testenv.Start(testenv.WithAPIServerArgs("feature-gates", cborGate+"=true"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns = "cbor"
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"k", "j", "s"} {
		if err := env.Client.Create(ctx, &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}); err != nil {
			t.Fatal(err)
		}
	}
	user, err := env.UserConfig(ctx, "cbor-user")
	if err != nil {
		t.Fatal(err)
	}
	cborAnswers, jsonAnswers := &mediaTypes{}, &mediaTypes{}
	newCBOR, newJSON := lockClients(encCBOR, cborAnswers), lockClients(encJSON, jsonAnswers)
	a, err := newCBOR(user, lock.WithNamespace(ns), lock.WithIdentity("a"), lock.WithoutAutoRenew())
	if err != nil {
		t.Fatal(err)
	}
	b, err := newCBOR(user, lock.WithNamespace(ns), lock.WithIdentity("b"))
	if err != nil {
		t.Fatal(err)
	}

	l, err := a.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatalf("acquire over CBOR: %v", err)
	}
	if err := l.Renew(ctx); err != nil {
		t.Fatalf("renew over CBOR: %v", err)
	}
	stored := &locksv1alpha1.DistributedLock{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "k"}, stored); err != nil {
		t.Fatal(err)
	}
	if h := stored.Status.Holder; h == nil || h.Identity != "a" || h.LeaseID != l.LeaseID() || stored.Status.FencingToken != l.FencingToken() ||
		h.RenewTime == nil || !h.RenewTime.After(h.AcquireTime.Time) {
		t.Fatalf("read back as JSON, the holder written over CBOR is %+v", stored.Status.Holder)
	}

	// b waits in the queue, watching the lock (a CBOR watch stream), and
	// takes it when a releases.
	got := make(chan error, 1)
	go func() {
		lb, err := b.Acquire(ctx, "k")
		if err == nil {
			err = lb.Release(ctx)
		}
		got <- err
	}()
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "k"}, stored)
		return err == nil && len(stored.Status.Waiters) == 1, err
	}); err != nil {
		t.Fatalf("b never queued: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("release over CBOR: %v", err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiter over CBOR: %v", err)
	}

	// A session: created, renewed (a merge patch answered in CBOR) and
	// holding a lock.
	s, err := a.NewSession(ctx, lock.WithTTL(5*time.Second))
	if err != nil {
		t.Fatalf("session over CBOR: %v", err)
	}
	ls, err := a.TryAcquire(ctx, "s", lock.WithSession(s))
	if err != nil {
		t.Fatalf("acquire in a session over CBOR: %v", err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return strings.Contains(cborAnswers.String(), "PATCH "+"application/cbor"), nil
	}); err != nil {
		t.Fatalf("no session renewal answered in CBOR: %s", cborAnswers)
	}
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}

	for _, want := range []string{"GET application/cbor", "PUT application/cbor", "POST application/cbor", "PATCH application/cbor", "DELETE application/cbor", "GET application/cbor-seq"} {
		if !strings.Contains(cborAnswers.String()+",", want+" ×") {
			t.Errorf("no %q among the CBOR client's answers: %s", want, cborAnswers)
		}
	}
	if share := cborAnswers.cborShare(); share != 1 {
		t.Errorf("%.0f%% of the CBOR client's answers were CBOR: %s", 100*share, cborAnswers)
	}

	j, err := newJSON(user, lock.WithNamespace(ns), lock.WithIdentity("j"))
	if err != nil {
		t.Fatal(err)
	}
	lj, err := j.TryAcquire(ctx, "j")
	if err != nil {
		t.Fatal(err)
	}
	if err := lj.Release(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("CBOR client set: %s; JSON client set: %s", cborAnswers, jsonAnswers)
	if share := jsonAnswers.cborShare(); share != 0 || jsonAnswers.String() == "" {
		t.Errorf("the JSON client's answers: %s", jsonAnswers)
	}
}
