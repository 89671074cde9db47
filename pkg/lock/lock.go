package lock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// Lock is one holding of a lock. Its Context ends when the holding is released,
// lost, or can no longer be proven; stop the guarded work then.
type Lock struct {
	c         *Client
	key, name string
	user      string
	requestID string
	leaseID   string
	token     int64
	lease     time.Duration
	margin    time.Duration

	ctx    context.Context
	cancel context.CancelCauseFunc

	// wmu serialises this holding's writes (renew, release) and guards obj.
	wmu sync.Mutex
	obj *locksv1alpha1.DistributedLock // last version this holder wrote or read

	// mu guards the fields below. It is never held across a request, so the
	// watchdog can always end the holding on time.
	mu       sync.Mutex
	deadline time.Time // safe deadline: last proven send + lease - margin
	finished bool
	unproven bool          // the holding ended because the safe deadline passed, not by the server's word
	ownsSlot bool          // started: ending the holding gives the process's queue slot back
	acquired time.Time     // when the holding started, on this client's clock
	extended chan struct{} // closed and replaced when the deadline moves
	stopped  chan struct{} // closed when the background loop exits
}

func (c *Client) newLock(a *attempt, obj *locksv1alpha1.DistributedLock) *Lock {
	h := obj.Status.Holder
	lease := time.Duration(h.LeaseDurationSeconds) * time.Second
	ctx, cancel := context.WithCancelCause(context.Background())
	return &Lock{
		c: c, key: a.key, name: a.name, user: a.user,
		requestID: h.RequestID, leaseID: h.LeaseID, token: obj.Status.FencingToken,
		lease: lease, margin: safetyMargin(lease),
		ctx: ctx, cancel: cancel, obj: obj,
		extended: make(chan struct{}),
	}
}

// holds reports whether st's holder is this holding: leaseID, requestID and
// token all match. A leaseID alone is not proof: another client may have
// written the same one (admission refuses only those status still remembers).
func (l *Lock) holds(st *locksv1alpha1.DistributedLockStatus) bool {
	h := st.Holder
	return h != nil && h.LeaseID == l.leaseID && h.RequestID == l.requestID && st.FencingToken == l.token
}

// recorded reports whether f is the record of this holding.
func (l *Lock) recorded(f *locksv1alpha1.FinishedHolding) bool {
	return f.LeaseID == l.leaseID && f.RequestID == l.requestID && f.FencingToken == l.token
}

// safetyMargin is how much earlier than the server the client gives up a lease:
// a tenth of it, at least 100ms, so scheduling delays never let it act late.
func safetyMargin(lease time.Duration) time.Duration { return max(lease/10, 100*time.Millisecond) }

// start sets the safe deadline from the send time of the write that proved the
// holding and starts the background renewal and the deadline watchdog.
func (l *Lock) start(sent time.Time) {
	l.mu.Lock()
	l.deadline = sent.Add(l.lease - l.margin)
	l.ownsSlot = true
	l.acquired = l.c.cfg.clock.Now()
	l.mu.Unlock()
	l.c.metrics.acquired()
	l.stopped = make(chan struct{})
	go l.watchdog()
	if l.c.cfg.autoRenew {
		go l.renewLoop()
	}
}

// Key is the business key the lock was acquired for.
func (l *Lock) Key() string { return l.key }

// Name is the lock object's name.
func (l *Lock) Name() string { return l.name }

// FencingToken is this holding's token: strictly greater than every token issued
// before for this lock. Send it with every write to the protected resource.
func (l *Lock) FencingToken() int64 { return l.token }

// LeaseID identifies this holding.
func (l *Lock) LeaseID() string { return l.leaseID }

// RequestID is the idempotency key of the acquire that created this holding.
func (l *Lock) RequestID() string { return l.requestID }

// ExpiresAt is the client's conservative view of the end of the lease: the send
// time of the last successful renewal plus the lease, minus a safety margin.
func (l *Lock) ExpiresAt() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// Context ends when the holding is released or lost; context.Cause says which
// (ErrReleased, or an error wrapping ErrLockLost).
func (l *Lock) Context() context.Context { return l.ctx }

// Done is closed when the holding is released or lost.
func (l *Lock) Done() <-chan struct{} { return l.ctx.Done() }

// Err is nil while the lock is held, else why it is not.
func (l *Lock) Err() error {
	if l.ctx.Err() == nil {
		return nil
	}
	return context.Cause(l.ctx)
}

// Renew extends the lease now. It returns an error wrapping ErrLockLost when the
// holding is over; a failed renewal that leaves the outcome unknown returns the
// error and keeps the old deadline.
func (l *Lock) Renew(ctx context.Context) (err error) {
	if m := l.c.metrics; m != nil {
		start := l.c.cfg.clock.Now()
		defer func() { m.operation(OpRenew, start, l.c.cfg.clock.Now(), err) }()
	}
	sent, err := l.renew(ctx)
	if err != nil {
		return err
	}
	l.extend(sent)
	return nil
}

// renew writes renewTime with the last known resourceVersion. It is the one
// function a session-based renewal would replace.
func (l *Lock) renew(ctx context.Context) (time.Time, error) {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	for {
		if err := l.Err(); err != nil {
			return time.Time{}, err
		}
		next := l.obj.DeepCopy()
		now := metav1.NewMicroTime(l.c.cfg.clock.Now())
		next.Status.Holder.RenewTime = &now
		next.Status.ObservedGeneration = next.Generation
		sent := l.c.cfg.clock.Now()
		err := l.c.c.Status().Update(ctx, next)
		if err == nil {
			l.obj = next
			return sent, nil
		}
		if !apierrors.IsConflict(err) {
			return time.Time{}, fmt.Errorf("kubelock: renew %s: %w", l.name, err)
		}
		l.c.metrics.conflict(OpRenew)
		// Someone else wrote (a waiter joined, the controller): reread and
		// renew again if the holding is still ours.
		if err := l.refresh(ctx); err != nil {
			return time.Time{}, err
		}
	}
}

// refresh rereads the lock and ends the holding if it is no longer ours. Callers hold l.wmu.
func (l *Lock) refresh(ctx context.Context) error {
	obj := &locksv1alpha1.DistributedLock{}
	err := l.c.c.Get(ctx, client.ObjectKey{Namespace: l.c.cfg.namespace, Name: l.name}, obj)
	if apierrors.IsNotFound(err) {
		err = lostWith(LostDeleted, "lock %s was deleted", l.name)
		l.finish(err)
		return err
	}
	if err != nil {
		return fmt.Errorf("kubelock: reading %s: %w", l.name, err)
	}
	if !l.holds(&obj.Status) {
		err := lost("lease %s of %s is no longer the holder", l.leaseID, l.name)
		if f := obj.Status.FindFinished(l.requestID); f != nil && l.recorded(f) {
			err = endedHolding(f)
		}
		l.finish(err)
		return err
	}
	l.obj = obj
	return nil
}

// extend moves the safe deadline to sent + lease - margin.
func (l *Lock) extend(sent time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if d := sent.Add(l.lease - l.margin); d.After(l.deadline) {
		l.deadline = d
		close(l.extended)
		l.extended = make(chan struct{})
	}
}

// Release gives the lock up. It is idempotent: releasing again returns nil.
// Releasing a lock that was lost returns an error wrapping ErrLockLost and never
// touches the new holder. The lock's Context ends before the release is sent,
// so guarded work stops before anyone else can start.
func (l *Lock) Release(ctx context.Context) (err error) {
	if m := l.c.metrics; m != nil {
		start := l.c.cfg.clock.Now()
		defer func() { m.operation(OpRelease, start, l.c.cfg.clock.Now(), err) }()
	}
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if err := l.Err(); err != nil {
		if errors.Is(err, ErrReleased) {
			return nil
		}
		if l.isUnproven() {
			// The lease could not be proven, but the apiserver may still show
			// it: free it for the next holder if it is still ours. The reread
			// and the resourceVersion precondition never touch another holding.
			l.releaseIfStillHeld(ctx)
		}
		return err
	}
	l.finish(ErrReleased)
	var back backoff
	for {
		next := l.obj.DeepCopy()
		next.EndHolding(locksv1alpha1.EndReasonReleased, l.user, metav1.NewMicroTime(l.c.cfg.clock.Now()))
		next.Status.ObservedGeneration = next.Generation
		err := l.c.c.Status().Update(ctx, next)
		switch {
		case err == nil:
			return nil
		case apierrors.IsConflict(err) || !definite(err):
			if ctx.Err() != nil {
				return fmt.Errorf("kubelock: release %s: %w", l.name, err)
			}
			if apierrors.IsConflict(err) {
				l.c.metrics.conflict(OpRelease)
			}
			if !apierrors.IsConflict(err) {
				_ = back.wait(ctx)
			}
			if err := l.reread(ctx); err != nil {
				return err
			}
		default:
			return fmt.Errorf("kubelock: release %s: %w", l.name, err)
		}
	}
}

// releaseIfStillHeld makes one conditional release of a holding the client
// gave up on. Callers hold l.wmu.
func (l *Lock) releaseIfStillHeld(ctx context.Context) {
	obj := &locksv1alpha1.DistributedLock{}
	if err := l.c.c.Get(ctx, client.ObjectKey{Namespace: l.c.cfg.namespace, Name: l.name}, obj); err != nil {
		return
	}
	if !l.holds(&obj.Status) {
		return
	}
	obj.EndHolding(locksv1alpha1.EndReasonReleased, l.user, metav1.NewMicroTime(l.c.cfg.clock.Now()))
	obj.Status.ObservedGeneration = obj.Generation
	_ = l.c.c.Status().Update(ctx, obj)
}

// reread refreshes l.obj for a release retry; it reports ErrLockLost (and
// changes nothing) once the holding is not ours any more.
func (l *Lock) reread(ctx context.Context) error {
	obj := &locksv1alpha1.DistributedLock{}
	if err := l.c.c.Get(ctx, client.ObjectKey{Namespace: l.c.cfg.namespace, Name: l.name}, obj); err != nil {
		if apierrors.IsNotFound(err) {
			return lostWith(LostDeleted, "lock %s was deleted", l.name)
		}
		return nil // keep the old object; the next write attempt tells
	}
	if !l.holds(&obj.Status) {
		f := obj.Status.FindFinished(l.requestID)
		if f == nil || !l.recorded(f) {
			return lost("lease %s of %s ended before the release", l.leaseID, l.name)
		}
		if f.EndReason == locksv1alpha1.EndReasonReleased && f.EndedBy == l.user {
			return nil // our own earlier release committed; its response was lost
		}
		return endedHolding(f)
	}
	l.obj = obj
	return nil
}

// finish ends the holding with cause (idempotent).
func (l *Lock) finish(cause error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.finishLocked(cause)
}

// finishUnproven ends the holding because its safe deadline passed, unless a
// renewal moved the deadline meanwhile; it reports whether it ended it.
func (l *Lock) finishUnproven(deadline time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.deadline.After(deadline) {
		return false
	}
	l.unproven = true
	l.finishLocked(lostWith(LostDeadline, "could not renew %s before its safe deadline", l.name))
	return true
}

func (l *Lock) isUnproven() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.unproven
}

func (l *Lock) finishLocked(cause error) {
	if l.finished {
		return
	}
	l.finished = true
	l.cancel(cause)
	if l.ownsSlot {
		l.c.slots.give(l.name)
		if m := l.c.metrics; m != nil {
			how := ""
			if !errors.Is(cause, ErrReleased) {
				how = lostCause(cause)
			}
			m.ended(l.c.cfg.clock.Now().Sub(l.acquired), how)
		}
	}
	if errors.Is(cause, ErrLockLost) {
		l.c.cfg.log.Info("lock lost", "lock", l.name, "token", l.token, "leaseID", l.leaseID, "cause", cause.Error())
	}
}

// watchdog ends the holding when the safe deadline passes without a renewal (I5).
func (l *Lock) watchdog() {
	defer close(l.stopped)
	clk := l.c.cfg.clock
	for {
		l.mu.Lock()
		deadline, extended := l.deadline, l.extended
		l.mu.Unlock()
		left := deadline.Sub(clk.Now())
		if left <= 0 && l.finishUnproven(deadline) {
			return
		}
		t := clk.NewTimer(left)
		select {
		case <-l.ctx.Done():
			t.Stop()
			return
		case <-extended:
			t.Stop()
		case <-t.C():
		}
	}
}

// renewLoop renews every lease/3 with jitter, and retries sooner after a failure.
func (l *Lock) renewLoop() {
	clk := l.c.cfg.clock
	interval := l.lease / 3
	wait := jitter(interval)
	for {
		t := clk.NewTimer(wait)
		select {
		case <-l.ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
		// The watchdog cancels l.ctx at the safe deadline, which also ends a
		// renewal request that hangs.
		err := l.Renew(l.ctx)
		switch {
		case err == nil:
			wait = jitter(interval)
		case errors.Is(err, ErrLockLost) || errors.Is(err, ErrReleased):
			return
		default:
			l.c.cfg.log.Info("renewal failed; retrying", "lock", l.name, "leaseID", l.leaseID, "error", err.Error())
			wait = min(interval/4, time.Second)
		}
	}
}

// jitter spreads d by ±10% so many holders do not renew in lockstep.
func jitter(d time.Duration) time.Duration {
	spread := int64(d / 5)
	if spread <= 0 {
		return d
	}
	return d - d/10 + time.Duration(rand.Int64N(spread))
}
