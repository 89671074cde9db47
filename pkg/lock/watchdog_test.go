package lock

import (
	"context"
	"errors"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// The watchdog must end a holding at its safe deadline even while a renewal
// request hangs; that a lease's end is on time against a real apiserver is
// proven in test/integration, this pins the timing logic with a fake clock.
func TestWatchdogFiresWhileARenewalHangs(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := locksv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	start := time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(start)
	obj := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "l", ResourceVersion: "7"}}
	obj.Acquire(locksv1alpha1.LockHolder{Identity: "me", User: "me", LeaseID: "0123456789abcdef", RequestID: "r", LeaseDurationSeconds: 3, AcquireTime: metav1.NewMicroTime(start)}, 7)

	renewing := make(chan struct{}, 1)
	hang := make(chan struct{})
	defer close(hang)
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(obj).WithStatusSubresource(obj).WithInterceptorFuncs(interceptor.Funcs{
		SubResourceUpdate: func(ctx context.Context, _ client.Client, _ string, _ client.Object, _ ...client.SubResourceUpdateOption) error {
			select {
			case renewing <- struct{}{}:
			default:
			}
			select { // an apiserver that accepted the connection and never answers
			case <-hang:
			case <-ctx.Done():
			}
			return errors.New("no answer")
		},
	}).Build()
	lc, err := NewFromClient(c, WithIdentity("me"), withClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	lc.user = "me"
	h, _ := findHolding(&obj.Status, obj.Status.Holder.RequestID)
	l := lc.newLock(&attempt{c: lc, key: "l", name: "l", user: "me"}, obj, h)
	if !lc.slots.take(context.Background(), "l", false) {
		t.Fatal("slot taken")
	}
	l.start(start)
	want := start.Add(3*time.Second - SafetyMargin(3*time.Second))
	if !l.ExpiresAt().Equal(want) {
		t.Fatalf("ExpiresAt = %s, want %s", l.ExpiresAt(), want)
	}

	// Let the first renewal start and hang: both loops (watchdog, renewal)
	// must have armed their timers before the clock moves, or the renewal's
	// timer starts after the step and never fires.
	until(t, "both loops arm their fake timers", func() bool { return clk.Waiters() >= 2 })
	clk.Step(1100 * time.Millisecond)
	select {
	case <-renewing:
	case <-time.After(10 * time.Second):
		t.Fatal("the renewal never started")
	}
	clk.SetTime(want.Add(-time.Millisecond))
	select {
	case <-l.Done():
		t.Fatal("Done fired before the safe deadline")
	case <-time.After(50 * time.Millisecond):
	}
	clk.SetTime(want)
	select {
	case <-l.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done did not fire at the safe deadline while a renewal hung")
	}
	if !errors.Is(context.Cause(l.Context()), ErrLockLost) {
		t.Fatalf("cause = %v, want ErrLockLost", context.Cause(l.Context()))
	}
}
