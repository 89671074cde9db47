package lock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// Lock is one holding of a lock: its exclusive holder, or one of its shared
// holdings (an RWMutex's reader, a Semaphore's permit) with a slot and token
// of its own. Its Context ends when the holding is released, lost, or can no
// longer be proven; stop the guarded work then.
type Lock struct {
	c         *Client
	key, name string
	user      string
	requestID string
	leaseID   string
	token     int64
	shared    bool
	slot      int32
	lockType  locksv1alpha1.LockType
	lease     time.Duration
	margin    time.Duration
	ending

	// wmu serialises this holding's writes (renew, release) and guards obj.
	wmu sync.Mutex
	obj *locksv1alpha1.DistributedLock // last version this holder wrote or read

	// fol follows the lock while this holding lasts, when its acquire had
	// waited (others queue for the lock); nil otherwise.
	fol *follower

	// session is the session whose renewals keep this holding alive, nil when
	// the holding renews its own lease.
	session *Session

	// deadline is the last proven send + lease - margin; in a session, the
	// session's deadline when the holding was last found held.
	deadline safeDeadline

	// mu guards the fields below. It is never held across a request, so the
	// watchdog can always end the holding on time.
	mu       sync.Mutex
	count    int // hold count (WithReentrancy): Release ends the holding at zero
	finished bool
	unproven bool      // the holding ended because the safe deadline passed, not by the server's word
	ownsSlot bool      // started: ending the holding gives the process's queue slot back
	acquired time.Time // when the holding started, on this client's clock
}

// holding is one entry of a lock's status: the exclusive holder, or a shared
// holder with its own token and slot.
type holding struct {
	locksv1alpha1.LockHolder
	token  int64
	slot   int32
	shared bool
}

// findHolding returns the holding created by requestID, if st has one.
func findHolding(st *locksv1alpha1.DistributedLockStatus, requestID string) (holding, bool) {
	for _, h := range st.Holdings() {
		if h.RequestID == requestID {
			found := holding{LockHolder: *h.LockHolder, token: h.Token, shared: h.Slot != nil}
			if found.shared {
				found.slot = *h.Slot
			}
			return found, true
		}
	}
	return holding{}, false
}

func (c *Client) newLock(a *attempt, obj *locksv1alpha1.DistributedLock, h holding) *Lock {
	lease := time.Duration(h.LeaseDurationSeconds) * time.Second
	parent := context.Background()
	if s := a.cfg.session; s != nil {
		parent = s.ctx // the holding ends when its session does
	}
	ctx, cancel := context.WithCancelCause(parent)
	return &Lock{
		c: c, key: a.key, name: a.name, user: a.user,
		requestID: h.RequestID, leaseID: h.LeaseID, token: h.token,
		shared: h.shared, slot: h.slot, lockType: obj.LockType(),
		lease: lease, margin: SafetyMargin(lease), session: a.cfg.session,
		ending: ending{ctx, cancel}, obj: obj, count: 1,
	}
}

// holds reports whether st still has this holding: leaseID, requestID, token
// (and slot) all match. A leaseID alone is not proof: another client may have
// written the same one (admission refuses only those status still remembers).
func (l *Lock) holds(st *locksv1alpha1.DistributedLockStatus) bool {
	if l.shared {
		i := st.SharedIndex(l.leaseID)
		if i < 0 {
			return false
		}
		h := &st.SharedHolders[i]
		return h.RequestID == l.requestID && h.FencingToken == l.token && h.Slot == l.slot
	}
	h := st.Holder
	return h != nil && h.LeaseID == l.leaseID && h.RequestID == l.requestID && st.FencingToken == l.token
}

// recorded reports whether f is the record of this holding.
func (l *Lock) recorded(f *locksv1alpha1.FinishedHolding) bool {
	sameSlot := f.Slot == nil
	if l.shared {
		sameSlot = f.Slot != nil && *f.Slot == l.slot
	}
	return f.LeaseID == l.leaseID && f.RequestID == l.requestID && f.FencingToken == l.token && sameSlot
}

// SafetyMargin is how long before the end of a lease (the send time of its
// last committed renewal plus the lease) the client stops trusting it:
// Lock.ExpiresAt and Session.ExpiresAt are that end minus the margin of the
// lease or TTL. It is a tenth of the lease, at least 100 ms, so that
// scheduling delays never let a holder act late.
func SafetyMargin(lease time.Duration) time.Duration { return max(lease/10, 100*time.Millisecond) }

// start sets the safe deadline from the send time of the write that proved the
// holding and starts the background renewal and the deadline watchdog. A
// holding in a session has neither: its context is a child of the session's,
// which its own watchdog ends.
func (l *Lock) start(sent time.Time) {
	l.mu.Lock()
	l.ownsSlot = !l.shared // the acquire gives a shared holding's slot back at once
	l.acquired = l.c.cfg.clock.Now()
	l.mu.Unlock()
	l.c.metrics.acquired()
	if l.session != nil {
		// Give the queue slot back and count the end however the session ends.
		context.AfterFunc(l.ctx, func() { l.finish(context.Cause(l.ctx)) })
		l.session.track(l)
		return
	}
	l.deadline.extend(sent.Add(l.lease - l.margin))
	go l.deadline.watch(l.c.cfg.clock, l.ctx.Done(), l.finishUnproven)
	if l.c.cfg.autoRenew {
		go keepRenewing(l.ctx, l.c.cfg.clock, l.lease/3, func() error {
			err := l.Renew(l.ctx)
			if err != nil && !errors.Is(err, ErrLockLost) && !errors.Is(err, ErrReleased) {
				l.c.cfg.log.Info("renewal failed; retrying", "lock", l.name, "leaseID", l.leaseID, "error", err.Error())
			}
			return err
		})
	}
}

// Key is the business key the lock was acquired for.
func (l *Lock) Key() string { return l.key }

// Name is the lock object's name.
func (l *Lock) Name() string { return l.name }

// FencingToken is this holding's token: strictly greater than every token issued
// before for this lock. Send it with every write to the protected resource;
// a shared holding sends its Slot too (a resource may fence per slot).
func (l *Lock) FencingToken() int64 { return l.token }

// Slot is the permit a shared holding occupies (a Semaphore's in
// [0, permits), an RWMutex reader's in [0, 64); a lock an earlier release
// stored with more may have one up to 1023); false for an exclusive one.
func (l *Lock) Slot() (int32, bool) { return l.slot, l.shared }

// Shared reports whether this is a shared holding (a reader or a permit).
func (l *Lock) Shared() bool { return l.shared }

// LeaseID identifies this holding.
func (l *Lock) LeaseID() string { return l.leaseID }

// RequestID is the idempotency key of the acquire that created this holding.
func (l *Lock) RequestID() string { return l.requestID }

// ExpiresAt is the client's conservative view of the end of the lease: the send
// time of the last successful renewal plus the lease, minus a safety margin.
// In a session it is the session's (Session.ExpiresAt) while the holding
// lasts; once it ended by itself (force-released), the session's from before
// the renewal after which the holder learned it.
func (l *Lock) ExpiresAt() time.Time {
	if l.session == nil {
		return l.deadline.get()
	}
	if d := l.deadline.get(); !d.IsZero() && l.Err() != nil && l.session.Err() == nil {
		return d
	}
	return l.session.ExpiresAt()
}

// ending is how to observe the end of a holding or a session.
type ending struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// Context ends when the holding (or session) is released, closed or lost,
// and context.Cause says which: ErrReleased, ErrSessionClosed, or an error
// wrapping ErrLockLost. Pass it to the guarded work.
func (e *ending) Context() context.Context { return e.ctx }

// Done is Context().Done(), for select statements.
func (e *ending) Done() <-chan struct{} { return e.ctx.Done() }

// Err is context.Cause(Context()) once it ended, nil before.
func (e *ending) Err() error {
	if e.ctx.Err() == nil {
		return nil
	}
	return context.Cause(e.ctx)
}

// Renew extends the lease now. It returns an error wrapping ErrLockLost when the
// holding is over; a failed renewal that leaves the outcome unknown returns the
// error and keeps the old deadline. A holding in a session renews nothing: its
// session renews it, and Renew returns Err (nil while the holding lives).
func (l *Lock) Renew(ctx context.Context) (err error) {
	if l.session != nil {
		return l.Err()
	}
	defer l.c.timed(opRenew)(&err)
	sent, err := l.renew(ctx)
	if err != nil {
		return err
	}
	l.extend(sent)
	return nil
}

// renew writes renewTime with the last known resourceVersion.
func (l *Lock) renew(ctx context.Context) (time.Time, error) {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	for {
		if err := l.Err(); err != nil {
			return time.Time{}, err
		}
		next := l.base()
		now := metav1.NewMicroTime(l.c.cfg.clock.Now())
		if l.shared {
			// Only this entry's renewTime: the rest of status stays as read.
			i := next.Status.SharedIndex(l.leaseID)
			if i < 0 { // l.obj always holds the entry (refresh keeps only such versions)
				return time.Time{}, lost("lease %s of %s is no longer a shared holder", l.leaseID, l.name)
			}
			next.Status.SharedHolders[i].RenewTime = &now
		} else {
			next.Status.Holder.RenewTime = &now
		}
		sent := l.c.cfg.clock.Now()
		err := l.c.writeStatus(ctx, next)
		if err == nil {
			l.obj = next
			l.c.seen.saw(next)
			return sent, nil
		}
		if !apierrors.IsConflict(err) {
			return time.Time{}, fmt.Errorf("kubelock: renew %s: %w", l.name, err)
		}
		l.c.metrics.conflict(opRenew)
		// Someone else wrote (a waiter joined, the controller): take their
		// version from the watch this holding follows, or reread; renew again
		// if the holding is still ours.
		if l.caughtUp(ctx) {
			continue
		}
		if _, err := l.refresh(ctx); err != nil {
			return time.Time{}, err
		}
	}
}

// refresh rereads the lock. While this holding is its holder, l.obj becomes
// the current version. Otherwise the holding ends, and refresh returns why (an
// error wrapping ErrLockLost) with status's record of the holding's end, if
// status still has one. A failed read changes nothing. Callers hold l.wmu.
func (l *Lock) refresh(ctx context.Context) (*locksv1alpha1.FinishedHolding, error) {
	obj := &locksv1alpha1.DistributedLock{}
	err := l.c.c.Get(ctx, client.ObjectKey{Namespace: l.c.cfg.namespace, Name: l.name}, obj)
	if apierrors.IsNotFound(err) {
		err = lostWith(lostDeleted, "lock %s was deleted", l.name)
		l.finish(err)
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("kubelock: reading %s: %w", l.name, err)
	}
	l.c.seen.saw(obj)
	if l.holds(&obj.Status) {
		l.obj = obj
		return nil, nil
	}
	err = lost("lease %s of %s is no longer the holder", l.leaseID, l.name)
	f := obj.Status.FindFinished(l.requestID)
	if f != nil && l.recorded(f) {
		err = endedHolding(f)
	} else {
		f = nil
	}
	l.finish(err)
	return f, err
}

// extend moves the safe deadline to sent + lease - margin.
func (l *Lock) extend(sent time.Time) { l.deadline.extend(sent.Add(l.lease - l.margin)) }

// Release gives the lock up. It is idempotent: releasing again returns nil.
// Releasing a lock that was lost returns an error wrapping ErrLockLost and never
// touches the new holder. The lock's Context ends before the release is sent,
// so guarded work stops before anyone else can start. A shared holding
// releases only its own entry. With WithReentrancy, Release lowers the hold
// count and releases only when it reaches zero.
func (l *Lock) Release(ctx context.Context) (err error) {
	defer l.c.timed(opRelease)(&err)
	l.wmu.Lock()
	defer l.wmu.Unlock()
	last, err := l.leave()
	if !last {
		return err // another re-entry still holds it
	}
	defer l.fol.stop() // followed until the release is written
	if err != nil {
		if errors.Is(err, ErrReleased) {
			return nil
		}
		// The lease could not be proven, but the apiserver may still show it:
		// free it for the next holder if it is still ours. The reread and the
		// resourceVersion precondition never touch another holding.
		if l.isUnproven() {
			if _, rerr := l.refresh(ctx); rerr == nil {
				_ = l.writeRelease(ctx)
			}
		}
		return err
	}
	back := retryBackoff()
	for {
		err := l.writeRelease(ctx)
		switch {
		case err == nil:
			return nil
		case definite(err) || ctx.Err() != nil:
			return fmt.Errorf("kubelock: release %s: %w", l.name, err)
		case apierrors.IsConflict(err):
			l.c.metrics.conflict(opRelease)
			if l.caughtUp(ctx) {
				continue
			}
		default:
			_ = pause(ctx, &back)
		}
		// A failed read keeps the old object: the next write tells.
		if f, err := l.refresh(ctx); errors.Is(err, ErrLockLost) {
			if f != nil && f.EndReason == locksv1alpha1.EndReasonReleased && f.EndedBy == l.user {
				return nil // our own earlier release committed; its response was lost
			}
			return err
		}
	}
}

// leave lowers the hold count. At zero (last) it ends the holding's context
// with ErrReleased, so guarded work stops before the release is sent and no
// re-entry joins it any more; prior is how the holding had ended before, nil
// while it was live.
func (l *Lock) leave() (last bool, prior error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	prior = l.Err()
	if l.count > 1 {
		l.count--
		return false, prior
	}
	l.count = 0
	l.finishLocked(ErrReleased)
	return true, prior
}

// enter raises the hold count of a live holding (WithReentrancy); false once
// it ended, also by its session's end, which finishes it a moment later.
func (l *Lock) enter() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.finished || !l.live() {
		return false
	}
	l.count++
	return true
}

// writeRelease writes the end of the holding onto l.obj. Callers hold l.wmu.
func (l *Lock) writeRelease(ctx context.Context) error {
	next := l.base()
	now := metav1.NewMicroTime(l.c.cfg.clock.Now())
	if l.shared {
		next.EndShared(l.leaseID, locksv1alpha1.EndReasonReleased, l.user, now)
	} else {
		next.EndHolding(locksv1alpha1.EndReasonReleased, l.user, now)
	}
	if err := l.c.writeStatus(ctx, next); err != nil {
		return err
	}
	// The next acquire of this lock starts from the release's response.
	l.c.seen.saw(next)
	return nil
}

// finish ends the holding with cause (idempotent).
func (l *Lock) finish(cause error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.finishLocked(cause)
}

// finishUnproven ends the holding because its safe deadline passed.
func (l *Lock) finishUnproven() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.unproven = true
	l.finishLocked(lostWith(lostDeadline, "could not renew %s before its safe deadline", l.name))
}

// isUnproven: the holding (or its session) ended because its safe deadline
// passed, so the apiserver may still show it.
func (l *Lock) isUnproven() bool {
	if l.session != nil {
		return l.session.isUnproven()
	}
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
	if !errors.Is(cause, ErrReleased) {
		l.fol.stop() // Release stops it once the release is written
	}
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

// safeDeadline is when a client stops trusting what it holds (I5): the send
// time of its last proven write plus the lease, minus the margin. It only
// moves later.
type safeDeadline struct {
	mu       sync.Mutex
	at       time.Time
	extended chan struct{} // closed when at moves; nil while nobody watches
}

func (d *safeDeadline) get() time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.at
}

// extend moves the deadline to t, if that is later.
func (d *safeDeadline) extend(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if t.After(d.at) {
		d.at = t
		if d.extended != nil {
			close(d.extended)
			d.extended = nil
		}
	}
}

// watch calls expire once the deadline passes without being extended, unless
// done closes first. It never waits for a request, so a renewal that hangs
// cannot delay expire.
func (d *safeDeadline) watch(clk clock.Clock, done <-chan struct{}, expire func()) {
	for {
		d.mu.Lock()
		if d.extended == nil {
			d.extended = make(chan struct{})
		}
		at, extended := d.at, d.extended
		d.mu.Unlock()
		left := at.Sub(clk.Now())
		if left <= 0 {
			expire()
			return
		}
		t := clk.NewTimer(left)
		select {
		case <-done:
			t.Stop()
			return
		case <-extended:
			t.Stop()
		case <-t.C():
		}
	}
}

// keepRenewing calls renew every interval with jitter, sooner after a
// failure, until ctx ends or renew says the holding is over.
func keepRenewing(ctx context.Context, clk clock.Clock, interval time.Duration, renew func() error) {
	wait := renewJitter(interval)
	for {
		t := clk.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
		err := renew()
		switch {
		case err == nil:
			wait = renewJitter(interval)
		case ctx.Err() != nil || errors.Is(err, ErrLockLost) || errors.Is(err, ErrReleased):
			return
		default:
			wait = min(interval/4, time.Second)
		}
	}
}

// renewJitter spreads d over 0.9d..1.08d so many holders do not renew in lockstep.
func renewJitter(d time.Duration) time.Duration { return wait.Jitter(d-d/10, 0.2) }
