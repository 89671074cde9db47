package lock

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// sessionFixture is a lock client on a fake apiserver with a stepped clock;
// hang makes session renewals hang, fail makes them fail at once (unknown
// outcome), and the counters say what was written.
type sessionFixture struct {
	clk                  *clocktesting.FakeClock
	c                    *Client
	hang, fail           atomic.Bool
	renewals, lockWrites atomic.Int64
}

func newSessionFixture(t *testing.T, objs ...client.Object) *sessionFixture {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := locksv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	f := &sessionFixture{clk: clocktesting.NewFakeClock(time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC))}
	fc := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).
		WithStatusSubresource(&locksv1alpha1.DistributedLock{}, &locksv1alpha1.LockSession{}).
		WithInterceptorFuncs(interceptor.Funcs{
			SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
				f.renewals.Add(1)
				if f.fail.Load() {
					return errors.New("connection reset by peer")
				}
				if f.hang.Load() { // an apiserver that accepted the connection and never answers
					<-ctx.Done()
					return ctx.Err()
				}
				return c.SubResource(sub).Patch(ctx, obj, p, opts...)
			},
			SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
				f.lockWrites.Add(1)
				return c.SubResource(sub).Update(ctx, obj, opts...)
			},
		}).Build()
	c, err := NewFromClient(fc, WithIdentity("Worker 7"), WithNamespace("default"), withClock(f.clk))
	if err != nil {
		t.Fatal(err)
	}
	c.user = "me" // no SelfSubjectReview on a fake apiserver
	f.c = c
	return f
}

// armed waits until n loops have armed their fake timers, so a step reaches them.
func (f *sessionFixture) armed(t *testing.T, n int) {
	t.Helper()
	until(t, "loops arm their fake timers", func() bool { return f.clk.Waiters() >= n })
}

// until waits for a condition that goroutines of the code under test make
// true (a timer armed, a renewal sent), not for time to pass; it fails the
// test instead of hanging when the condition never comes.
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 10*time.Second, true,
		func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		t.Fatalf("waiting until %s: %v", what, err)
	}
}

func freeLock(name string) *locksv1alpha1.DistributedLock {
	return &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}
}

func ended(t *testing.T, done <-chan struct{}, want bool, what string) {
	t.Helper()
	wait := 50 * time.Millisecond
	if want {
		wait = 10 * time.Second
	}
	select {
	case <-done:
		if !want {
			t.Fatalf("%s ended too early", what)
		}
	case <-time.After(wait):
		if want {
			t.Fatalf("%s did not end", what)
		}
	}
}

// I5 per session: the safe deadline is the send time of the last committed
// renewal plus the TTL minus the margin; a renewal with an unknown outcome
// does not move it, and one that hangs cannot delay the end.
func TestSessionDeadline(t *testing.T) {
	f := newSessionFixture(t, freeLock("a"))
	start := f.clk.Now()
	s, err := f.c.NewSession(context.Background(), WithTTL(6*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close(context.Background()) }()
	margin := SafetyMargin(6 * time.Second)
	if want := start.Add(6*time.Second - margin); !s.ExpiresAt().Equal(want) {
		t.Fatalf("ExpiresAt = %s, want %s (create sent + TTL - margin)", s.ExpiresAt(), want)
	}
	stored := &locksv1alpha1.LockSession{}
	if err := f.c.c.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: s.Name()}, stored); err != nil {
		t.Fatal(err)
	}
	if stored.Spec.User != "me" || stored.Spec.Identity != "Worker 7" || stored.Spec.TTLSeconds != 6 || stored.Spec.PodUID != "" || len(stored.OwnerReferences) != 0 {
		t.Fatalf("stored spec %+v, owners %v", stored.Spec, stored.OwnerReferences)
	}

	// A committed renewal moves the deadline to its send time + TTL - margin.
	f.armed(t, 2)
	f.clk.Step(2200 * time.Millisecond) // past TTL/3 with jitter (at most 2.16s)
	until(t, "the first renewal is sent", func() bool { return f.renewals.Load() >= 1 })
	renewedAt := f.clk.Now()
	want := renewedAt.Add(6*time.Second - margin)
	until(t, "the renewal's answer moves the deadline", func() bool { return s.ExpiresAt().Equal(want) })

	// Renewals that fail with an unknown outcome do not extend it.
	f.fail.Store(true)
	f.armed(t, 2)
	for i := 0; i < 6 && f.clk.Now().Before(want.Add(-time.Second)); i++ {
		n := f.renewals.Load()
		f.clk.Step(2200 * time.Millisecond) // past the next renewal, successful or not
		until(t, "the next renewal is sent", func() bool { return f.renewals.Load() != n })
		f.armed(t, 2)
	}
	if !s.ExpiresAt().Equal(want) {
		t.Fatalf("failed renewals moved ExpiresAt to %s (want %s)", s.ExpiresAt(), want)
	}
	// A hanging renewal cannot keep the session alive past its deadline.
	f.fail.Store(false)
	f.hang.Store(true)
	f.clk.SetTime(want.Add(-time.Millisecond))
	ended(t, s.Done(), false, "the session, before its safe deadline,")
	f.clk.SetTime(want)
	ended(t, s.Done(), true, "the session at its safe deadline")
	if !errors.Is(s.Err(), ErrLockLost) || errors.Is(s.Err(), ErrSessionClosed) {
		t.Fatalf("session cause = %v, want a deadline loss", s.Err())
	}
}

// A lock in a session names it, carries its TTL, never writes a renewal of
// its own and ends when the session does; a closed session acquires nothing.
func TestLockInSession(t *testing.T) {
	f := newSessionFixture(t, freeLock("a"), freeLock("b"))
	ctx := context.Background()
	s, err := f.c.NewSession(ctx, WithTTL(9*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	la, err := f.c.TryAcquire(ctx, "a", WithSession(s), WithLeaseDuration(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	lb, err := f.c.TryAcquire(ctx, "b", WithSession(s))
	if err != nil {
		t.Fatal(err)
	}
	obj := &locksv1alpha1.DistributedLock{}
	if err := f.c.c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "a"}, obj); err != nil {
		t.Fatal(err)
	}
	if h := obj.Status.Holder; h.Session != s.Name() || h.LeaseDurationSeconds != 9 {
		t.Fatalf("holder session %q lease %ds, want %q and the TTL 9s", h.Session, h.LeaseDurationSeconds, s.Name())
	}
	if !la.ExpiresAt().Equal(s.ExpiresAt()) {
		t.Fatalf("lock ExpiresAt %s, session's %s", la.ExpiresAt(), s.ExpiresAt())
	}
	writes := f.lockWrites.Load()
	if err := la.Renew(ctx); err != nil {
		t.Fatalf("Renew of a live session holding = %v, want nil", err)
	}
	f.armed(t, 2) // the session's watchdog and renewal; the locks run neither
	for range 3 {
		n := f.renewals.Load()
		f.clk.Step(3300 * time.Millisecond)
		until(t, "the next renewal is sent", func() bool { return f.renewals.Load() != n })
		f.armed(t, 2)
	}
	if w := f.lockWrites.Load(); w != writes {
		t.Fatalf("%d lock writes while the session renewed: holdings in a session renew nothing", w-writes)
	}
	if la.Err() != nil || lb.Err() != nil {
		t.Fatalf("locks ended while their session lives: %v, %v", la.Err(), lb.Err())
	}

	if err := lb.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	ended(t, la.Done(), true, "the lock of a closed session")
	if !errors.Is(la.Err(), ErrSessionClosed) || !errors.Is(la.Err(), ErrLockLost) {
		t.Fatalf("lock cause = %v, want ErrSessionClosed (an ErrLockLost)", la.Err())
	}
	if !errors.Is(lb.Err(), ErrReleased) {
		t.Fatalf("released lock's cause = %v", lb.Err())
	}
	if err := la.Renew(ctx); !errors.Is(err, ErrSessionClosed) {
		t.Fatalf("Renew after Close = %v, want the session's Err", err)
	}
	if err := f.c.c.Get(ctx, client.ObjectKey{Namespace: "default", Name: s.Name()}, &locksv1alpha1.LockSession{}); err == nil {
		t.Fatal("Close left the session object")
	}
	if err := s.Close(ctx); err != nil {
		t.Fatalf("second Close = %v", err)
	}
	// The slot of a lock ended by its session is free again, and a closed
	// session refuses at once.
	if _, err := f.c.TryAcquire(ctx, "b", WithSession(s)); !errors.Is(err, ErrSessionClosed) {
		t.Fatalf("acquire in a closed session = %v, want ErrSessionClosed", err)
	}
	l, err := f.c.TryAcquire(ctx, "b")
	if err != nil {
		t.Fatalf("acquire without a session after the session closed: %v", err)
	}
	_ = l.Release(ctx)
}

func TestSessionTTLBounds(t *testing.T) {
	f := newSessionFixture(t)
	for _, d := range []time.Duration{4 * time.Second, 3601 * time.Second, 5500 * time.Millisecond} {
		if _, err := f.c.NewSession(context.Background(), WithTTL(d)); err == nil {
			t.Errorf("WithTTL(%s) accepted", d)
		}
	}
}

// A holding in a session renews nothing, so its holder learns of a
// force-release when a renewal's answer counts fewer holdings than it has.
func TestSessionNoticesAForceReleasedHolding(t *testing.T) {
	f := newSessionFixture(t, freeLock("a"))
	ctx := context.Background()
	s, err := f.c.NewSession(ctx, WithTTL(6*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close(ctx) }()
	l, err := f.c.TryAcquire(ctx, "a", WithSession(s))
	if err != nil {
		t.Fatal(err)
	}
	obj := &locksv1alpha1.DistributedLock{}
	if err := f.c.c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "a"}, obj); err != nil {
		t.Fatal(err)
	}
	obj.EndHolding(locksv1alpha1.EndReasonForceReleased, "breaker", metav1.NewMicroTime(f.clk.Now()))
	if err := f.c.c.Status().Update(ctx, obj); err != nil {
		t.Fatal(err)
	}
	ended(t, l.Done(), false, "the lock, before the session's next renewal,")
	proven := s.ExpiresAt()
	f.armed(t, 2)
	f.clk.Step(2200 * time.Millisecond) // the renewal answers status.locks 0: fewer than the client holds
	ended(t, l.Done(), true, "the force-released lock after the session's renewal")
	if !l.ExpiresAt().Equal(proven) || !s.ExpiresAt().After(proven) {
		t.Fatalf("lost lock's ExpiresAt %s, want %s: the renewal after the force-release (session's now %s) proves nothing of it", l.ExpiresAt(), proven, s.ExpiresAt())
	}
	if !errors.Is(l.Err(), ErrLockLost) || lostCause(l.Err()) != lostForceReleased {
		t.Fatalf("cause = %v, want a force-release", l.Err())
	}
	if s.Err() != nil {
		t.Fatalf("the session ended with its lock: %v", s.Err())
	}
}
