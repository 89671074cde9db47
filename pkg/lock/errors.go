package lock

import (
	"context"
	"errors"
	"fmt"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

var (
	// ErrLocked is returned by TryAcquire when someone else holds the lock or
	// others are queued for it. The error is a *LockedError naming the holder.
	ErrLocked = errors.New("kubelock: lock is held by another holder")
	// ErrLockLost means the holding is over or can no longer be proven: it expired,
	// was force-released, or renewals failed until the safe deadline.
	ErrLockLost = errors.New("kubelock: lock lost")
	// ErrQueueFull means the lock's wait queue is at spec.maxWaiters.
	ErrQueueFull = errors.New("kubelock: wait queue is full")
	// ErrTooLarge means the write would make the lock object larger than the
	// apiserver's store takes (etcd's --max-request-bytes): too many or too
	// long holdings and waiters. Nothing was written; a queued request that
	// meets it has left the queue.
	ErrTooLarge = errors.New("kubelock: the lock object would be larger than the apiserver's store takes (etcd's --max-request-bytes)")
	// ErrNotFound means the lock object does not exist and auto-creation is off.
	ErrNotFound = errors.New("kubelock: lock not found")
	// ErrTimeout means the wait for the lock ran out; it wraps context.DeadlineExceeded.
	ErrTimeout = fmt.Errorf("kubelock: timed out waiting for the lock: %w", context.DeadlineExceeded)
	// ErrReleased is the cause of a lock context that ended by Release.
	ErrReleased = errors.New("kubelock: lock released")
	// ErrMode means the lock cannot be held in the mode asked for: WithShared on a
	// Mutex, or (WithReentrancy) a key the client already holds in the other mode.
	ErrMode = errors.New("kubelock: lock cannot be held in this mode")
	// ErrSessionClosed is the cause of a session's context after Close, and so
	// of the contexts of the locks it still held: they end with it
	// (SessionClosed), so it wraps ErrLockLost.
	ErrSessionClosed error = &lostError{reason: "its session was closed", cause: lostSession}
)

// LockedError says who holds a lock that TryAcquire could not take.
type LockedError struct {
	// Name is the lock object's name.
	Name string
	// Holder is the current exclusive holder, nil when there is none.
	Holder *locksv1alpha1.LockHolder
	// Shared is how many shared holdings (readers, permits) the lock has.
	Shared int
	// Waiters is the queue length.
	Waiters int
}

func (e *LockedError) Error() string {
	switch {
	case e.Holder != nil:
		return fmt.Sprintf("kubelock: lock %s is held by %s (user %s, lease %s), %d waiter(s)",
			e.Name, e.Holder.Identity, e.Holder.User, e.Holder.LeaseID, e.Waiters)
	case e.Shared > 0:
		return fmt.Sprintf("kubelock: lock %s is held by %d shared holder(s), %d waiter(s)", e.Name, e.Shared, e.Waiters)
	}
	return fmt.Sprintf("kubelock: lock %s is free but %d waiter(s) are queued ahead", e.Name, e.Waiters)
}

// Unwrap makes errors.Is(err, ErrLocked) true.
func (e *LockedError) Unwrap() error { return ErrLocked }

// lostError explains why a holding is over; it wraps ErrLockLost. cause is a
// LostXxx label value, "" when not known.
type lostError struct{ reason, cause string }

func (e *lostError) Error() string { return "kubelock: lock lost: " + e.reason }
func (e *lostError) Unwrap() error { return ErrLockLost }

func lost(format string, args ...any) error { return &lostError{reason: fmt.Sprintf(format, args...)} }

// lostWith is lost with a cause for kubelock_client_locks_lost_total.
func lostWith(cause, format string, args ...any) error {
	return &lostError{reason: fmt.Sprintf(format, args...), cause: cause}
}

// endedHolding describes a finished holding from recentAcquisitions.
func endedHolding(f *locksv1alpha1.FinishedHolding) error {
	cause := lostReplaced
	switch f.EndReason {
	case locksv1alpha1.EndReasonExpired:
		cause = lostExpired
	case locksv1alpha1.EndReasonForceReleased:
		cause = lostForceReleased
	case locksv1alpha1.EndReasonReleased:
		cause = lostReleased
	case locksv1alpha1.EndReasonSessionExpired, locksv1alpha1.EndReasonSessionClosed:
		cause = lostSession
	}
	return lostWith(cause, "lease %s (token %d) already ended: %s by %s", f.LeaseID, f.FencingToken, f.EndReason, f.EndedBy)
}
