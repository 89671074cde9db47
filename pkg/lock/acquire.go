package lock

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// Acquire takes the lock for key, waiting in its FIFO queue until it is this
// caller's turn, ctx ends or the wait timeout passes (ErrTimeout). It takes
// the lock exclusively unless asked WithShared, or the lock is a Semaphore. A
// holding that waited keeps watching the lock while it lasts and ctx has not
// ended, so that its renewals and release rarely meet a conflict. When ctx
// ends or the wait times out first, Acquire takes back what it wrote: its
// queue entry, and a holding whose answer was lost on the way (as etcd's
// concurrency.Mutex deletes its key when Lock fails); a later call with the
// same request ID then learns that holding ended.
func (c *Client) Acquire(ctx context.Context, key string, opts ...AcquireOption) (*Lock, error) {
	return c.acquire(ctx, key, true, opts)
}

// TryAcquire takes the lock for key only if it can be taken in the mode asked
// for (free; for a shared acquisition, no writer and a free permit) and nobody
// is queued; otherwise it returns a *LockedError (errors.Is(err, ErrLocked)).
// It never waits for the lock; when ctx has no deadline, its retries of a
// write whose outcome is unknown stop after 30 s.
func (c *Client) TryAcquire(ctx context.Context, key string, opts ...AcquireOption) (*Lock, error) {
	return c.acquire(ctx, key, false, opts)
}

// attempt is one logical acquire call; its internal retries share the request
// and lease IDs, so a retry after a lost response finds its own holding (I6).
type attempt struct {
	c         *Client
	key, name string
	user      string
	cfg       acquireConfig
	leaseID   string
	wait      bool
	deadline  time.Time // the end of the wait, for the queue entry
	// firstSent is when the first acquire write of this call was sent; a holding
	// found later was created by one of them, so it is the safe base for the deadline.
	firstSent time.Time
	// unknownAt is status.transitions of the object an acquire write with an
	// unknown outcome was based on, or -1, and unknownHeld its holdings then.
	// While fewer holdings than recentAcquisitions remembers could have ended
	// after that write's (those held then, and those acquired since), a missing
	// record proves it never committed.
	unknownAt   int64
	unknownHeld int64
	// queued is the queue status last reported to cfg.onQueue.
	queued QueueStatus
	// queuedAt is when this call joined the queue, zero while it has not.
	queuedAt time.Time
	// callerCtx is the context the caller passed, before this call's own
	// deadline: the watch a waiting call opens lives within it, so that the
	// holding can keep following the lock after the call returns.
	callerCtx context.Context
	// w watches the lock once this call waits in its queue; nil before.
	w *lockWatch
	// back paces retries after failures whose outcome is unknown, and last is
	// the error worth reporting of those.
	back wait.Backoff
	last error
}

// op is the operation label of this call.
func (a *attempt) op() string {
	if a.wait {
		return opAcquire
	}
	return opTryAcquire
}

func (c *Client) acquire(ctx context.Context, key string, wait bool, opts []AcquireOption) (l *Lock, err error) {
	a := attempt{c: c, key: key, wait: wait, leaseID: randomID(), unknownAt: -1, callerCtx: ctx, back: retryBackoff()}
	defer c.timed(a.op())(&err)
	if err := a.prepare(ctx, opts); err != nil {
		return nil, err
	}
	ctx, cancel := a.bound(ctx)
	defer cancel()
	if c.cfg.reentrant {
		// One acquisition of a key at a time per client, so that a second
		// goroutine re-enters the holding the first one is taking.
		if !c.gates.take(ctx, a.name, wait) {
			return nil, a.busy(ctx)
		}
		defer c.gates.give(a.name)
		if l, ok, err := c.reenter(a.name, a.cfg.shared); ok {
			return l, err
		}
	}
	if !c.slots.take(ctx, a.name, wait) {
		return nil, a.busy(ctx)
	}
	l, err = a.run(ctx)
	if err != nil {
		c.slots.give(a.name)
		return nil, err
	}
	if l.shared {
		// The process's slot serialises waiting, not holding: its goroutines
		// may hold several shared entries at once.
		c.slots.give(a.name)
	}
	if c.cfg.reentrant {
		c.remember(l)
	}
	return l, nil
}

// prepare settles the call's lock name, options and user, and checks its
// session.
func (a *attempt) prepare(ctx context.Context, opts []AcquireOption) (err error) {
	if a.name, err = NameForKey(a.key); err != nil {
		return err
	}
	if a.cfg, err = a.c.acquireConfig(opts); err != nil {
		return err
	}
	if a.user, err = a.c.User(ctx); err != nil {
		return err
	}
	return a.checkSession()
}

// bound is ctx ending when the call must stop: when its session ends (its
// queue entry would be dropped), and after its wait timeout (Acquire).
func (a *attempt) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	unhook := func() bool { return false }
	if s := a.cfg.session; s != nil {
		unhook = context.AfterFunc(s.ctx, cancel)
	}
	stop := func() { unhook(); cancel() }
	var timeout time.Duration
	switch _, ok := ctx.Deadline(); {
	case a.wait:
		timeout = a.cfg.waitTimeout
	case !ok:
		// TryAcquire never waits for the lock, but it does retry a write whose
		// outcome is unknown; bound that when the caller gave no deadline.
		timeout = tryTimeout
	default:
		return ctx, stop
	}
	ctx, cancelTimeout := context.WithTimeout(ctx, timeout)
	a.deadline, _ = ctx.Deadline() // the queue entry's, should Acquire queue
	return ctx, func() { cancelTimeout(); stop() }
}

// busy says why the process-local turn for the lock was not had: another
// goroutine holds or awaits it (TryAcquire), or ctx ended first.
func (a *attempt) busy(ctx context.Context) error {
	if !a.wait {
		return fmt.Errorf("%w: another goroutine of this process holds or awaits lock %s", ErrLocked, a.name)
	}
	return a.waitErr(ctx)
}

// run is the acquire loop. Each turn starts from a version of the lock: the
// last one this client saw, only when it leads straight to the acquiring
// write (lastSeen); the one a watch or a conflict brought; or one read afresh.
//  1. if this request already holds it or held it, answer from status (own, I6);
//  2. if it admits this request's mode and the queue is empty or headed by
//     this request, write the holding, exclusive or shared on the lowest free
//     slot (take);
//  3. otherwise fail (TryAcquire), or join the queue (enqueue) and wait on a
//     watch of the one lock object for its next version (await).
//
// A write that meets a conflict or whose outcome is unknown starts another
// turn (retryAfter); only definite answers end the loop.
func (a *attempt) run(ctx context.Context) (*Lock, error) {
	defer func() { a.w.stop() }()
	obj := a.lastSeen()
	for {
		if ctx.Err() != nil {
			return nil, a.giveUp(ctx)
		}
		l, next, err := a.turn(ctx, obj)
		if l != nil || err != nil {
			return l, err
		}
		obj = next
	}
}

// turn is one step of run from obj, the version of the lock to go on from
// (nil: read it first). It returns the holding once taken, or an error that
// ends the call, or else the version for the next turn (nil: read afresh).
func (a *attempt) turn(ctx context.Context, obj *locksv1alpha1.DistributedLock) (*Lock, *locksv1alpha1.DistributedLock, error) {
	if obj == nil {
		var err error
		if obj, err = a.read(ctx); obj == nil {
			return nil, nil, err
		}
	}
	if l, done, err := a.own(ctx, obj); done {
		return l, nil, err
	}
	st := &obj.Status
	mode, err := a.mode(obj)
	if err != nil {
		return nil, nil, err
	}
	if err := a.checkTraceable(st); err != nil {
		return nil, nil, err
	}
	pos := st.WaiterIndex(a.cfg.requestID)
	if pos >= 0 && st.Waiters[pos].User != a.user {
		return nil, nil, a.requestTaken(st.Waiters[pos].User)
	}
	switch {
	case obj.Admits(mode) && (len(st.Waiters) == 0 || pos == 0):
		next, sent, err := a.take(ctx, obj, mode)
		if err == nil {
			return a.hold(next, sent), nil, nil
		}
		if pos == 0 && tooLarge(err) {
			return nil, nil, a.unfit(ctx, err)
		}
		next, err = a.retryAfter(ctx, obj, err)
		return nil, next, err
	case !a.wait:
		return nil, nil, &LockedError{Name: a.name, Holder: st.Holder, Shared: len(st.SharedHolders), Waiters: len(st.Waiters)}
	case pos < 0:
		next, err := a.enqueue(ctx, obj, mode)
		if err == nil {
			return nil, next, nil
		}
		next, err = a.retryAfter(ctx, obj, err)
		return nil, next, err
	default:
		a.report(pos, st)
		return nil, a.await(ctx, obj), nil
	}
}

// lastSeen is the object this client saw last of the lock when it leads
// straight to the acquiring write, nil otherwise: when nothing contends, an
// acquire is then one round trip.
func (a *attempt) lastSeen() *locksv1alpha1.DistributedLock {
	if obj, ok := a.c.seen.get(a.name); ok && a.writesStraight(obj) {
		return obj
	}
	return nil
}

// read reads the lock, creating it first when the client may. It returns nil
// and no error after a failure whose outcome is unknown (paused): the next
// turn reads again.
func (a *attempt) read(ctx context.Context) (*locksv1alpha1.DistributedLock, error) {
	obj, err := a.c.get(ctx, a.key, a.name, a.c.cfg.autoCreate)
	switch {
	case err == nil:
		return obj, nil
	case errors.Is(err, ErrNotFound), errors.Is(err, errKeyCollision):
		return nil, err
	case definite(err):
		return nil, a.failed(err)
	}
	a.retryLater(ctx, err)
	return nil, nil
}

// checkTraceable says why this request must not write again, if it must
// not: an earlier write of it whose outcome was unknown may have committed,
// and its record may have aged out of status since, so taking the lock again
// could make a second holding (I6).
func (a *attempt) checkTraceable(st *locksv1alpha1.DistributedLockStatus) error {
	if a.unknownAt < 0 {
		return nil
	}
	if ended := st.Transitions - a.unknownAt + a.unknownHeld; ended > locksv1alpha1.MaxRecentAcquisitions {
		return lost("cannot tell whether request %s acquired: %d holdings may have ended since and status remembers only the last %d",
			a.cfg.requestID, ended, locksv1alpha1.MaxRecentAcquisitions)
	}
	return nil
}

// retryAfter is where run goes after a write based on obj failed with err.
// A definite answer (a full queue among them) ends the call. After a
// conflict, a waiter's watch brings the version that won; otherwise the next
// turn reads the lock afresh (nil), after a pause when the outcome is unknown.
func (a *attempt) retryAfter(ctx context.Context, obj *locksv1alpha1.DistributedLock, err error) (*locksv1alpha1.DistributedLock, error) {
	switch {
	case errors.Is(err, ErrQueueFull):
		return nil, err
	case definite(err):
		return nil, a.failed(err)
	case apierrors.IsConflict(err):
		a.c.metrics.conflict(a.op())
		return a.w.won(ctx, obj.ResourceVersion), nil
	}
	a.retryLater(ctx, err)
	return nil, nil
}

// retryLater keeps err as the cause to report if the call runs out of time,
// and pauses before the next try.
func (a *attempt) retryLater(ctx context.Context, err error) {
	a.last = keepCause(a.last, err)
	_ = pause(ctx, &a.back)
}

// hold starts the Lock of the holding this call's write created: obj is the
// lock as that write returned it, sent the time it was sent.
func (a *attempt) hold(obj *locksv1alpha1.DistributedLock, sent time.Time) *Lock {
	if !a.queuedAt.IsZero() {
		a.c.metrics.waited(sent.Sub(a.queuedAt))
	}
	h, _ := findHolding(&obj.Status, a.cfg.requestID)
	l := a.c.newLock(a, obj, h)
	if a.w != nil {
		// Others queue for this lock: keep following it, so the renewals and
		// the release write on its newest version.
		l.follow(a.w)
		a.w = nil
	}
	l.start(sent)
	return l
}

// await waits in the queue for the lock's next version after obj, on a watch
// opened the first time; nil when the next turn should read it afresh.
func (a *attempt) await(ctx context.Context, obj *locksv1alpha1.DistributedLock) *locksv1alpha1.DistributedLock {
	if a.w == nil {
		a.w = a.c.watch(a.callerCtx, a.name)
	}
	return a.w.next(ctx, obj.ResourceVersion)
}

// writesStraight reports whether obj, the object this client saw last, leads
// straight to this request's acquiring write: it is of this key, records
// nothing of this request, supports its mode and admits it now with nobody
// queued ahead. Any other answer (locked, queued, already held) is given only
// from a fresh read.
func (a *attempt) writesStraight(obj *locksv1alpha1.DistributedLock) bool {
	if _, ok := collidingKey(obj, a.key); ok {
		return false
	}
	st := &obj.Status
	if _, held := findHolding(st, a.cfg.requestID); held || st.FindFinished(a.cfg.requestID) != nil || a.unknownAt >= 0 {
		return false
	}
	mode, err := a.mode(obj)
	if err != nil {
		return false
	}
	return obj.Admits(mode) && len(st.Waiters) == 0
}

// own answers a request whose holding status already records (I6): the same
// lease while it lasts, or ErrLockLost once it ended. done is false otherwise.
func (a *attempt) own(ctx context.Context, obj *locksv1alpha1.DistributedLock) (l *Lock, done bool, err error) {
	if h, ok := findHolding(&obj.Status, a.cfg.requestID); ok {
		if h.User != a.user {
			return nil, true, fmt.Errorf("kubelock: acquire %q: request ID %s belongs to user %s", a.key, a.cfg.requestID, h.User)
		}
		// The holding may come from an earlier call with this request ID whose
		// send time is unknown here: prove it with a renewal before trusting it.
		// A holding in this call's session lives as long as the session.
		if s := a.cfg.session; (s != nil || h.Session != "") && (s == nil || h.Session != s.name) {
			return nil, true, fmt.Errorf("kubelock: acquire %q: request ID %s holds the lock in session %q, not this call's", a.key, a.cfg.requestID, h.Session)
		}
		if h.shared != (a.cfg.shared || obj.LockType() == locksv1alpha1.Semaphore) {
			return nil, true, fmt.Errorf("%w: acquire %q: request ID %s holds the lock in the other mode", ErrMode, a.key, a.cfg.requestID)
		}
		l := a.c.newLock(a, obj, h)
		if !a.firstSent.IsZero() || l.session != nil {
			l.start(a.firstSent)
			return l, true, nil
		}
		sent, err := l.renew(ctx)
		if err != nil {
			l.cancel(err) // never started: it owns no queue slot to give back
			return nil, true, err
		}
		l.start(sent)
		return l, true, nil
	}
	if f := obj.Status.FindFinished(a.cfg.requestID); f != nil {
		return nil, true, endedHolding(f)
	}
	return nil, false, nil
}

// requestTaken is the error of a request whose ID another user's queue
// entry has: requestIDs are visible to every lock user, and one nobody has
// used yet is anyone's (a predictable one can be taken first). This request
// never queues while that entry stays, so it fails at once.
func (a *attempt) requestTaken(user string) error {
	return fmt.Errorf("kubelock: acquire %q: request ID %s is the queue entry of user %q: request IDs are visible to every lock user, choose one nobody can guess",
		a.key, a.cfg.requestID, user)
}

// report tells the WithQueueCallback callback about a changed place in the queue.
func (a *attempt) report(pos int, st *locksv1alpha1.DistributedLockStatus) {
	if a.cfg.onQueue == nil {
		return
	}
	q := QueueStatus{Position: pos + 1, Waiters: len(st.Waiters), Holder: st.Holder, Holdings: int(st.HolderCount)}
	if q.Position == a.queued.Position && q.Waiters == a.queued.Waiters && q.Holdings == a.queued.Holdings && sameHolding(q.Holder, a.queued.Holder) {
		return
	}
	a.queued = q
	a.cfg.onQueue(q)
}

func sameHolding(x, y *locksv1alpha1.LockHolder) bool {
	if x == nil || y == nil {
		return x == y
	}
	return x.LeaseID == y.LeaseID && x.RequestID == y.RequestID && x.User == y.User
}

// mode is how this request holds obj: shared when asked, or for a Semaphore;
// ErrMode when the lock's type does not support it.
func (a *attempt) mode(obj *locksv1alpha1.DistributedLock) (locksv1alpha1.Mode, error) {
	mode := obj.DefaultMode()
	if a.cfg.shared {
		mode = locksv1alpha1.Shared
	}
	if !obj.Supports(mode) {
		return mode, fmt.Errorf("%w: acquire %q: lock %s is a %s, which cannot be held %s", ErrMode, a.key, a.name, obj.LockType(), mode)
	}
	return mode, nil
}

// take writes this request's holding, with the token the server expects:
// the holder, or a shared holding on the lowest free slot.
func (a *attempt) take(ctx context.Context, obj *locksv1alpha1.DistributedLock, mode locksv1alpha1.Mode) (*locksv1alpha1.DistributedLock, time.Time, error) {
	token, err := locksv1alpha1.NextFencingToken(obj.ResourceVersion)
	if err != nil {
		return nil, time.Time{}, err
	}
	lease := a.cfg.lease
	if lease == 0 {
		lease = time.Duration(obj.Spec.LeaseDurationSeconds) * time.Second
	}
	now := metav1.NewMicroTime(a.c.cfg.clock.Now())
	podName, podUID := a.c.pod()
	next := obj.DeepCopy()
	h := locksv1alpha1.LockHolder{
		Identity:             a.c.cfg.identity,
		User:                 a.user,
		LeaseID:              a.leaseID,
		RequestID:            a.cfg.requestID,
		LeaseDurationSeconds: int32(lease / time.Second),
		PodName:              podName,
		PodUID:               podUID,
		Session:              a.sessionName(),
		AcquireTime:          now,
		RenewTime:            &now,
	}
	if mode == locksv1alpha1.Shared {
		slot, _ := obj.FreeSlot() // the caller checked Admits: there is one
		next.AcquireShared(h, slot, token)
	} else {
		next.Acquire(h, token)
	}
	sent := a.c.cfg.clock.Now()
	if a.firstSent.IsZero() {
		a.firstSent = sent
	}
	if err := a.c.writeStatus(ctx, next); err != nil {
		if !definite(err) && !apierrors.IsConflict(err) && a.unknownAt < 0 {
			// The write may have committed: from now on the call must find it.
			a.unknownAt, a.unknownHeld = obj.Status.Transitions, int64(len(obj.Status.Holdings()))
		}
		return nil, time.Time{}, err
	}
	a.c.seen.saw(next)
	a.c.cfg.log.V(1).Info("acquired", "lock", a.name, "mode", mode, "token", token, "leaseID", a.leaseID)
	return next, sent, nil
}

// enqueue appends this request at the tail of the wait queue, within the
// lock's bounds: admission refuses more entries of one user (or of one pod)
// and a deadline beyond spec.maxWaitSeconds, so the client asks for no more.
func (a *attempt) enqueue(ctx context.Context, obj *locksv1alpha1.DistributedLock, mode locksv1alpha1.Mode) (*locksv1alpha1.DistributedLock, error) {
	if err := a.queueRoom(obj); err != nil {
		return nil, err
	}
	podName, podUID := a.c.pod()
	enqueued := a.c.cfg.clock.Now().Truncate(time.Microsecond)
	deadline := a.deadline.Truncate(time.Microsecond)
	if last := enqueued.Add(obj.MaxWait()); deadline.After(last) {
		deadline = last
	}
	if !deadline.After(enqueued) {
		deadline = enqueued.Add(time.Microsecond)
	}
	next := obj.DeepCopy()
	next.Status.AppendWaiter(locksv1alpha1.Waiter{
		Identity:    a.c.cfg.identity,
		User:        a.user,
		RequestID:   a.cfg.requestID,
		EnqueueTime: metav1.NewMicroTime(enqueued),
		Deadline:    metav1.NewMicroTime(deadline),
		PodName:     podName,
		PodUID:      podUID,
		Mode:        mode,
		Session:     a.sessionName(),
	})
	if err := a.c.writeStatus(ctx, next); err != nil {
		if tooLarge(err) {
			return nil, fmt.Errorf("%w: %w", ErrQueueFull, sizeLimit(fmt.Sprintf("join the queue of %q", a.key), err))
		}
		return nil, err
	}
	a.c.seen.saw(next)
	a.queuedAt = a.c.cfg.clock.Now()
	return next, nil
}

// queueRoom says why obj's queue has no room for this request, if it has none.
func (a *attempt) queueRoom(obj *locksv1alpha1.DistributedLock) error {
	st := &obj.Status
	if len(st.Waiters) >= obj.MaxWaiters() {
		return fmt.Errorf("%w: %d waiter(s), spec.maxWaiters is %d", ErrQueueFull, len(st.Waiters), obj.MaxWaiters())
	}
	_, podUID := a.c.pod()
	mine := 0
	for _, w := range st.Waiters {
		if w.User != a.user {
			continue
		}
		mine++
		if podUID != "" && w.PodUID == podUID {
			return fmt.Errorf("%w: this pod already waits for %s (request %s); a pod may have one entry per lock", ErrQueueFull, a.name, w.RequestID)
		}
	}
	if mine >= obj.MaxWaitersPerUser() {
		return fmt.Errorf("%w: user %s already has %d waiter(s), the lock allows %d per user", ErrQueueFull, a.user, mine, obj.MaxWaitersPerUser())
	}
	return nil
}

// giveUp withdraws the call after its time ran out, and says why.
func (a *attempt) giveUp(ctx context.Context) error {
	a.withdraw(ctx)
	err, last := a.waitErr(ctx), a.last
	switch {
	case last == nil:
		return err
	case !a.wait:
		// TryAcquire never waits for the lock: running out of time means the
		// apiserver (or admission) did not answer.
		return fmt.Errorf("%w; the apiserver did not answer before the deadline: %w", err, last)
	default:
		return fmt.Errorf("%w (last error: %w)", err, last)
	}
}

// failed is the error of an acquire the apiserver refused with err.
func (a *attempt) failed(err error) error {
	if tooLarge(err) {
		return sizeLimit(fmt.Sprintf("acquire %q", a.key), err)
	}
	return fmt.Errorf("kubelock: acquire %q: %w", a.key, err)
}

// sizeLimit explains what, a write refused by tooLarge, keeping err.
func sizeLimit(what string, err error) error {
	return fmt.Errorf("%w: %s: too many or too long holdings and waiters: %w", ErrTooLarge, what, err)
}

// unfit ends the call of a queue head whose holding does not fit in the lock
// object (err, refused by tooLarge): the same write fails again until others
// leave, so it leaves the queue at once, rather than hold back everyone
// behind it until the controller drops it after handoffTimeoutSeconds.
func (a *attempt) unfit(ctx context.Context, err error) error {
	a.withdraw(ctx)
	return fmt.Errorf("%w; left the queue", a.failed(err))
}

// withdraw takes back what this call may have left in the lock: its queue
// entry, and the holding an acquire write of unknown outcome may have made
// (only that write's own lease). The caller never got that holding, so
// nobody would renew or release it: without this it would block the lock
// for a lease, or for as long as its session lasts. ctx is already over, so
// it works within a short deadline of its own. Only such a holding is worth
// retrying for: a queue entry carries the call's deadline, and the
// controller drops it then anyway. What it cannot write, expiry ends.
func (a *attempt) withdraw(ctx context.Context) {
	if !a.wait && a.unknownAt < 0 {
		return // TryAcquire never queues, and nothing of it may have committed
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	back := retryBackoff()
	for {
		err := a.withdrawFrom(wctx)
		switch {
		case err == nil || definite(err) || apierrors.IsNotFound(err):
			return
		case apierrors.IsConflict(err):
			continue
		}
		if a.unknownAt < 0 || pause(wctx, &back) != nil {
			return
		}
	}
}

// withdrawFrom is one try of withdraw: it reads the lock, and writes it
// without this call's queue entry and its unknown write's holding, if it
// shows either.
func (a *attempt) withdrawFrom(ctx context.Context) error {
	obj := &locksv1alpha1.DistributedLock{}
	if err := a.c.c.Get(ctx, client.ObjectKey{Namespace: a.c.cfg.namespace, Name: a.name}, obj); err != nil {
		return err
	}
	changed := obj.Status.RemoveWaiter(a.cfg.requestID)
	if h, ok := findHolding(&obj.Status, a.cfg.requestID); ok && a.unknownAt >= 0 && h.LeaseID == a.leaseID {
		now := metav1.NewMicroTime(a.c.cfg.clock.Now())
		if h.shared {
			obj.EndShared(h.LeaseID, locksv1alpha1.EndReasonReleased, a.user, now)
		} else {
			obj.EndHolding(locksv1alpha1.EndReasonReleased, a.user, now)
		}
		changed = true
	}
	if !changed {
		return nil
	}
	return a.c.writeStatus(ctx, obj)
}

// keepCause returns err as the last error worth reporting, unless it is only
// the caller's deadline cutting a request short: then the error before it (a
// webhook that failed, an apiserver that refused) says more.
func keepCause(last, err error) error {
	if last != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
		return last
	}
	return err
}

// sessionName is the name of the call's session, "" without one.
func (a *attempt) sessionName() string {
	if a.cfg.session == nil {
		return ""
	}
	return a.cfg.session.name
}

// waitErr says why the call's context ended: ErrTimeout at its deadline.
func (a *attempt) waitErr(ctx context.Context) error {
	if err := a.checkSession(); err != nil {
		return err
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return ErrTimeout
	}
	return a.failed(ctx.Err())
}

// lockWatch follows one lock object; waiting clients watch only their lock.
type lockWatch struct {
	c    *Client
	name string
	w    watch.Interface
	// ctx bounds the watch: the caller's context, which the holding's
	// follower (Lock.follow) outlives only until it ends.
	ctx context.Context
}

func (c *Client) watch(ctx context.Context, name string) *lockWatch {
	return &lockWatch{c: c, name: name, ctx: ctx}
}

// next returns the lock's next version after rv, or nil when the caller should
// read it afresh (the watch ended, the object was deleted, or ctx ended).
func (w *lockWatch) next(ctx context.Context, rv string) *locksv1alpha1.DistributedLock {
	if w.w == nil {
		// The watch outlives this call's own deadline but not the caller's
		// context (a holding that waited keeps following its lock while it
		// lasts, Lock.follow); stop ends it sooner.
		ww, err := w.c.c.Watch(w.ctx, &locksv1alpha1.DistributedLockList{},
			client.InNamespace(w.c.cfg.namespace),
			client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("metadata.name", w.name)},
			&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: false}})
		if err != nil {
			back := retryBackoff()
			_ = pause(ctx, &back)
			return nil
		}
		w.w = ww
	}
	select {
	case <-ctx.Done():
		return nil
	case ev, ok := <-w.w.ResultChan():
		if obj, isLock := ev.Object.(*locksv1alpha1.DistributedLock); ok && isLock && (ev.Type == watch.Modified || ev.Type == watch.Added) {
			w.c.seen.saw(obj)
			return obj
		}
		w.stop()
		return nil
	}
}

// won returns, after a write based on version rv met a conflict, the
// version that won as the watch brings it: the first newer event within
// followWait, or a later one already waiting. nil when there is no watch, it
// ended or lagged: the caller reads the lock instead.
func (w *lockWatch) won(ctx context.Context, rv string) *locksv1alpha1.DistributedLock {
	if w == nil || w.w == nil {
		return nil
	}
	t := time.NewTimer(followWait)
	defer t.Stop()
	var got *locksv1alpha1.DistributedLock
	for {
		var ev watch.Event
		var ok bool
		if got == nil {
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
				return nil
			case ev, ok = <-w.w.ResultChan():
			}
		} else {
			select {
			case ev, ok = <-w.w.ResultChan():
			default:
				return got // and nothing newer is waiting
			}
		}
		obj, isLock := ev.Object.(*locksv1alpha1.DistributedLock)
		if !ok || !isLock || (ev.Type != watch.Modified && ev.Type != watch.Added) {
			w.stop() // the next wait watches again
			return got
		}
		w.c.seen.saw(obj)
		if newerRV(obj.ResourceVersion, rv) {
			got = obj
		}
	}
}

// stop ends the watch (nil-safe: a call that never waited has none).
func (w *lockWatch) stop() {
	if w != nil && w.w != nil {
		w.w.Stop()
		w.w = nil
	}
}
