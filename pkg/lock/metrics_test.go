package lock

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

type timeoutErr struct{}

func (timeoutErr) Error() string { return "i/o timeout" }
func (timeoutErr) Timeout() bool { return true }

func TestOutcomeOf(t *testing.T) {
	gr := schema.GroupResource{Group: "locks.kubelock.io", Resource: "distributedlocks"}
	for _, tt := range []struct {
		err  error
		want string
	}{
		{nil, outcomeSuccess},
		{fmt.Errorf("kubelock: acquire %q: %w", "k", &LockedError{Name: "k"}), outcomeLocked},
		{ErrTimeout, outcomeTimeout},
		{context.DeadlineExceeded, outcomeTimeout},
		{context.Canceled, outcomeCanceled},
		{fmt.Errorf("x: %w", endedHolding(&locksv1alpha1.FinishedHolding{EndReason: locksv1alpha1.EndReasonExpired})), outcomeLost},
		{fmt.Errorf("x: %w", ErrQueueFull), outcomeQueueFull},
		{ErrNotFound, outcomeNotFound},
		{apierrors.NewConflict(gr, "k", errors.New("changed")), outcomeConflict},
		{apierrors.NewForbidden(gr, "k", errors.New("[kubelock:holder-only]")), outcomeDenied},
		{apierrors.NewInternalError(errors.New("etcd")), outcomeUnknown},
		{apierrors.NewTimeoutError("slow", 1), outcomeUnknown},
		{&url.Error{Op: "Put", URL: "https://apiserver", Err: timeoutErr{}}, outcomeUnknown},
		{errors.New("kubelock: request ID is too long"), outcomeError},
	} {
		if got := outcomeOf(tt.err); got != tt.want {
			t.Errorf("outcomeOf(%v) = %s, want %s", tt.err, got, tt.want)
		}
	}
}

func TestLostCause(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want string
	}{
		{endedHolding(&locksv1alpha1.FinishedHolding{EndReason: locksv1alpha1.EndReasonForceReleased}), lostForceReleased},
		{endedHolding(&locksv1alpha1.FinishedHolding{EndReason: locksv1alpha1.EndReasonExpired}), lostExpired},
		{endedHolding(&locksv1alpha1.FinishedHolding{EndReason: locksv1alpha1.EndReasonReleased}), lostReleased},
		{lostWith(lostDeadline, "late"), lostDeadline},
		{lost("gone"), lostReplaced},
	} {
		if got := lostCause(tt.err); got != tt.want {
			t.Errorf("lostCause(%v) = %s, want %s", tt.err, got, tt.want)
		}
	}
}

// TestMetricsShareRegistry: two clients on one registerer count into the same
// series; a nil *metrics records nothing and does not panic.
func TestMetricsShareRegistry(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m1, err := newMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	m2, err := newMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	if m1.duration != m2.duration || m1.lost != m2.lost || m1.held != m2.held {
		t.Fatal("the second registration did not reuse the first's collectors")
	}
	var none *metrics
	none.conflict(opRenew)
	none.acquired()
	none.ended(0, lostDeadline)
	none.waited(0)
}
