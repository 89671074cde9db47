// Package controllers holds the DistributedLock reconciler: it expires each
// holding, exclusive or shared, whose lease stopped being renewed, ends
// holdings whose session or pod is gone, keeps wait queues moving across
// modes, keeps the Held condition and observedGeneration current, emits Events
// for the transitions a person must see (all of them with EventsAll), counts
// every transition in metrics, and deletes idle auto-created locks; and the
// LockSession reconciler, which times sessions' renewals.
package controllers

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/source"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/internal/metrics"
	"github.com/kubelock/kubelock/internal/whoami"
)

// Defaults of the reconciler's options.
const (
	// DefaultExpiryGrace is added to every lease before it is expired.
	DefaultExpiryGrace = 2 * time.Second
	// DefaultIdleTimeout is how long an auto-created lock may stay idle.
	DefaultIdleTimeout = time.Hour
	// ControllerName names the controller (logs, metrics, Events).
	ControllerName = "distributedlock"
)

// deadlinePriority is the work-queue priority of a lock whose deadline (a
// lease's end, a waiter's or a hand-off's) came, and of every event about a
// lock with a holding or a waiter (enqueueLocks): ahead of idle locks'
// bookkeeping and of a new controller's initial list.
const deadlinePriority = 10

// atDeadline comes back after d (never when 0) ahead of other work.
func atDeadline(d time.Duration) ctrl.Result {
	if d <= 0 {
		return ctrl.Result{}
	}
	p := deadlinePriority
	return ctrl.Result{RequeueAfter: d, Priority: &p}
}

// conflictRetry is how soon a reconcile that lost a write race runs again; the
// watch event of the winning write usually triggers it sooner.
const conflictRetry = 200 * time.Millisecond

// A lock some of whose entries' sessions or pods could not be read is
// reconciled again after a backoff per lock, from readRetryBase doubling up
// to readRetryMax, or at its next deadline if that comes first; a reconcile
// that reads them all resets it.
const (
	readRetryBase = 200 * time.Millisecond
	readRetryMax  = time.Minute
)

// readBackoff is the per-lock backoff of failed reads; its zero value is ready.
type readBackoff struct {
	once    sync.Once
	limiter workqueue.TypedRateLimiter[types.NamespacedName]
}

func (b *readBackoff) get() workqueue.TypedRateLimiter[types.NamespacedName] {
	b.once.Do(func() {
		b.limiter = workqueue.NewTypedItemExponentialFailureRateLimiter[types.NamespacedName](readRetryBase, readRetryMax)
	})
	return b.limiter
}

// retry returns res requeued no later than the next backoff of key when
// failed, and resets key's backoff when not.
func (b *readBackoff) retry(key types.NamespacedName, res ctrl.Result, failed bool) ctrl.Result {
	if !failed {
		b.get().Forget(key)
		return res
	}
	if after := b.get().When(key); res.RequeueAfter <= 0 || after < res.RequeueAfter {
		return atDeadline(after)
	}
	return res
}

// Event reasons.
const (
	EventAcquired = "Acquired"
	EventReleased = "Released"
	EventExpired  = "Expired"
	// EventSessionExpired and EventSessionClosed end a holding with its session.
	EventSessionExpired = string(locksv1alpha1.EndReasonSessionExpired)
	EventSessionClosed  = string(locksv1alpha1.EndReasonSessionClosed)
	EventForceReleased  = "ForceReleased"
	EventWaiterDropped  = "WaiterDropped"
	EventDeleted        = "IdleLockDeleted"
)

// Reconciler reconciles DistributedLocks. Setup builds it.
type Reconciler struct {
	client   client.Client
	recorder events.EventRecorder
	events   EventPolicy
	clock    clock.PassiveClock
	timing   timing
	ctrlOpts controller.Options

	obs      observations
	sessions sessionObservations
	// reads backs off the retries of locks whose entries' reads failed.
	reads readBackoff
	// reader reads locks (decoded object by object: cache.go), sessions and
	// pod metadata from the controller's cache.
	reader client.Reader
	// apiReader reads live, to confirm that a session or pod the cache lacks is gone.
	apiReader client.Reader
	malformed malformedLocks

	// namespaces limits Setup's controller to locks, sessions and pods in
	// them; empty: all.
	namespaces []string
	// username is the configured user name; empty means self's.
	username string
	self     *whoami.Self
}

// Option configures a Reconciler.
type Option func(*Reconciler)

// WithClock sets the clock that measures leases, waits and idleness; default the real clock.
func WithClock(c clock.PassiveClock) Option { return func(r *Reconciler) { r.clock = c } }

// WithExpiryGrace sets the grace added to every lease; default DefaultExpiryGrace.
func WithExpiryGrace(d time.Duration) Option { return func(r *Reconciler) { r.timing.grace = d } }

// WithIdleTimeout sets how long an auto-created lock may stay idle before it is
// deleted; default DefaultIdleTimeout.
func WithIdleTimeout(d time.Duration) Option { return func(r *Reconciler) { r.timing.idleTimeout = d } }

// WithUsername sets the user name written to recentAcquisitions[].endedBy; by
// default the controller learns its own with a SelfSubjectReview.
func WithUsername(name string) Option { return func(r *Reconciler) { r.username = name } }

// WithEvents sets which transitions are reported as Events; default EventsImportant.
func WithEvents(p EventPolicy) Option { return func(r *Reconciler) { r.events = p } }

// WithNamespaces limits Setup's controller to the locks, sessions and pods
// in namespaces; by default it watches all. SetupStandby ignores it.
func WithNamespaces(namespaces ...string) Option {
	return func(r *Reconciler) { r.namespaces = namespaces }
}

// WithControllerOptions sets controller-runtime options such as MaxConcurrentReconciles.
func WithControllerOptions(o controller.Options) Option {
	return func(r *Reconciler) { r.ctrlOpts = o }
}

// Setup builds the reconciler and registers it with mgr, together with a
// runnable that reports leadership (kubelock_controller_is_leader). Like every
// controller-runtime controller it runs only while mgr holds the leader lease.
// The operator and the test environment both call it.
func Setup(mgr ctrl.Manager, opts ...Option) (*Reconciler, error) {
	r, err := newReconciler(mgr, opts)
	if err != nil {
		return nil, err
	}
	// The controller's own cache (cache.go), warm on every replica, and the
	// standby's observations of it (warmup.go).
	var namespaces map[string]cache.Config
	for _, ns := range r.namespaces {
		if namespaces == nil {
			namespaces = map[string]cache.Config{}
		}
		namespaces[ns] = cache.Config{}
	}
	c, err := newCache(mgr, cache.Options{DefaultNamespaces: namespaces}, r.clock)
	if err != nil {
		return nil, err
	}
	if err := mgr.Add(warmCache{c}); err != nil {
		return nil, err
	}
	if err := mgr.Add(&standbyObserver{cache: c, r: r, elected: mgr.Elected()}); err != nil {
		return nil, err
	}
	r.reader = c
	if r.ctrlOpts.CacheSyncTimeout == 0 {
		// controller-runtime's 2 minutes: a new leader listing a few hundred
		// thousand locks from a busy apiserver takes longer (100,000 took 30 s
		// on a loaded 2-core machine), and a controller that gives up stops
		// the manager.
		r.ctrlOpts.CacheSyncTimeout = 10 * time.Minute
	}
	if err := mgr.Add(&leaderReporter{obs: &r.obs, sessions: &r.sessions, clock: r.clock, grace: r.timing.grace}); err != nil {
		return nil, err
	}
	if err := indexLocks(context.Background(), c); err != nil {
		return nil, err
	}
	kick := make(chan event.GenericEvent)
	// Pods are watched as metadata only: a deletion is all that matters, and
	// whole pods of the cluster would cost far more memory.
	err = ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		WatchesRawSource(source.Kind(c, &cachedLock{}, &enqueueLocks{})).
		WatchesRawSource(source.Kind[client.Object](c, &locksv1alpha1.LockSession{}, handler.EnqueueRequestsFromMapFunc(r.locksOfSession), sessionEnding)).
		WatchesRawSource(source.Kind[client.Object](c, podMetadata(), handler.EnqueueRequestsFromMapFunc(r.locksOfPod), podDeleted)).
		WatchesRawSource(source.Channel(kick, &handler.EnqueueRequestForObject{})).
		WithOptions(r.ctrlOpts).
		Complete(r)
	if err != nil {
		return nil, err
	}
	sr := &sessionReconciler{client: r.client, reader: r.reader, clock: r.clock, grace: r.timing.grace, sessions: &r.sessions, kick: kick}
	return r, ctrl.NewControllerManagedBy(mgr).
		Named(SessionControllerName).
		WatchesRawSource(source.Kind[client.Object](c, &locksv1alpha1.LockSession{}, &handler.EnqueueRequestForObject{})).
		WatchesRawSource(source.Kind[client.Object](c, &cachedLock{}, sessionsOfLock)).
		WithOptions(r.ctrlOpts).
		Complete(sr)
}

// newReconciler builds a reconciler with opts applied and checked; its
// caller sets the reader of locks, sessions and pods.
func newReconciler(mgr ctrl.Manager, opts []Option) (*Reconciler, error) {
	c := mgr.GetClient()
	r := &Reconciler{
		client:    c,
		events:    EventsImportant,
		clock:     clock.RealClock{},
		timing:    timing{grace: DefaultExpiryGrace, idleTimeout: DefaultIdleTimeout},
		self:      whoami.New(c),
		apiReader: mgr.GetAPIReader(),
	}
	for _, o := range opts {
		o(r)
	}
	switch {
	case r.timing.grace < 0:
		return nil, fmt.Errorf("controllers: expiry grace must not be negative, got %s", r.timing.grace)
	case r.timing.idleTimeout <= 0:
		return nil, fmt.Errorf("controllers: idle timeout must be positive, got %s", r.timing.idleTimeout)
	}
	if _, err := ParseEventPolicy(string(r.events)); err != nil {
		return nil, err
	}
	r.recorder = NewRateLimitedRecorder(mgr.GetEventRecorder("kubelock-controller"),
		EventLimit{Burst: DefaultEventBurst, Interval: DefaultEventInterval, Locks: DefaultEventLocks}, r.clock)
	return r, nil
}

// +kubebuilder:rbac:groups=locks.kubelock.io,resources=distributedlocks,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups=locks.kubelock.io,resources=distributedlocks/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=selfsubjectreviews,verbs=create

// Reconcile brings one lock up to date with the controller's observations.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	// 1. Read the lock from the cache; forget locks that are gone, and leave
	// alone one that does not decode (logged and counted by readLock).
	lock, received, ok, err := r.readLock(ctx, req.NamespacedName)
	switch {
	case apierrors.IsNotFound(err):
		r.obs.forget(req.NamespacedName)
		r.malformed.forget(req.NamespacedName)
		r.reads.get().Forget(req.NamespacedName)
		return ctrl.Result{}, nil
	case err != nil:
		metrics.ReconcileErrors.WithLabelValues(metrics.StepGet).Inc()
		return ctrl.Result{}, err
	case !ok:
		return ctrl.Result{}, nil
	}
	now := r.clock.Now()

	// 2. Fold it into what this controller has observed; report transitions.
	// What this version shows was seen when the cache received it, however
	// long the lock then waited in the queue: a renewal is never later than
	// that, so a lease timed from there still ends after the client's.
	prev := r.obs.get(req.NamespacedName)
	if isStale(prev, lock) {
		return ctrl.Result{RequeueAfter: conflictRetry}, nil
	}
	seen := now
	if !received.IsZero() && received.Before(now) {
		seen = received
	}
	obs, transitions := observe(prev, lock, seen)
	r.obs.put(req.NamespacedName, obs)
	r.report(ctx, lock, transitions)

	// 3. Decide, from observations, the sessions and pods the lock depends on,
	// and this controller's clock only. A session or pod that could not be
	// read holds back only the entries that depend on it.
	live, failed := r.liveness(ctx, lock, now)
	d := decide(lock, obs, live, now, r.timing)

	// 4. Act on it, and 5. come back at the nearest deadline, or sooner to
	// read again what could not be read; no periodic scan.
	res, err := r.act(ctx, req.NamespacedName, lock, obs, live, d, now)
	if err != nil {
		return res, err
	}
	return r.reads.retry(req.NamespacedName, res, failed), nil
}

// act carries out decision d about lock: it deletes an idle auto-created
// lock, or writes status if it changed. A write ends at most
// MaxRecentAcquisitions holdings, so while the decision about the written
// object still acts, it writes again from that object; every acting write
// removes a holding or a waiter, so this ends. The result requeues at the
// nearest deadline of the last version.
func (r *Reconciler) act(ctx context.Context, key types.NamespacedName, lock *locksv1alpha1.DistributedLock, obs observation, live liveness, d decision, now time.Time) (ctrl.Result, error) {
	for {
		if d.delete {
			return r.deleteIdle(ctx, lock)
		}
		updated, err := r.writeStatus(ctx, lock, d, now)
		switch {
		case apierrors.IsConflict(err):
			metrics.WriteConflicts.Inc()
			log.FromContext(ctx).V(1).Info("lock changed meanwhile; reconciling again")
			return ctrl.Result{RequeueAfter: conflictRetry}, nil
		case err != nil:
			metrics.ReconcileErrors.WithLabelValues(metrics.StepWrite).Inc()
			return ctrl.Result{}, err
		case updated == nil:
			return atDeadline(d.requeueAfter), nil
		}
		// Our own write is observed now, without reporting it a second time.
		lock = updated
		obs, _ = observe(&obs, lock, now)
		r.obs.put(key, obs)
		if d = decide(lock, obs, live, now, r.timing); !d.acts() {
			return atDeadline(d.requeueAfter), nil
		}
	}
}

// writeStatus applies d and the status bookkeeping to lock and writes status if
// anything changed, with lock's resourceVersion as precondition. It returns the
// written object, or nil when nothing needed writing.
func (r *Reconciler) writeStatus(ctx context.Context, lock *locksv1alpha1.DistributedLock, d decision, now time.Time) (*locksv1alpha1.DistributedLock, error) {
	endedBy := ""
	if len(d.ends) > 0 {
		var err error
		if endedBy, err = r.Username(ctx); err != nil {
			return nil, err
		}
	}
	desired := desiredStatus(lock, d, endedBy, now)
	if equality.Semantic.DeepEqual(lock.Status, desired.Status) {
		return nil, nil
	}
	if err := r.client.Status().Update(ctx, desired); err != nil {
		return nil, err
	}
	written := r.clock.Now()
	logger := log.FromContext(ctx)
	for _, e := range d.ends {
		reason := string(e.reason)
		if e.reason == locksv1alpha1.EndReasonExpired {
			metrics.Expirations.Inc()
			if !e.due.IsZero() {
				metrics.Expired(written.Sub(e.due))
			}
		}
		// The write is the change of holdings; its watch event is not reported again.
		metrics.TransitionsObserved.WithLabelValues(reason).Inc()
		logger.Info("holding ended", "lock", client.ObjectKeyFromObject(lock), "holder", e.identity,
			"token", e.token, "leaseID", e.leaseID, "slot", slotValue(e.slot), "reason", reason, "why", e.why)
		r.recorder.Eventf(desired, nil, corev1.EventTypeNormal, reason, "End",
			"lease %s of %s (fencing token %d%s) ended %s: %s", e.leaseID, e.identity, e.token, slotNote(e.slot), reason, e.why)
	}
	for _, w := range d.drop {
		metrics.WaitersDropped.WithLabelValues(string(w.reason)).Inc()
		logger.Info("waiter dropped", "lock", client.ObjectKeyFromObject(lock), "waiter", w.identity,
			"requestID", w.requestID, "reason", w.reason)
		r.recorder.Eventf(desired, nil, corev1.EventTypeNormal, EventWaiterDropped, "DropWaiter",
			"dropped waiter %s (request %s): %s", w.identity, w.requestID, w.reason)
	}
	return desired, nil
}

// slotValue is a shared holding's slot for a log line, -1 for an exclusive one.
func slotValue(slot *int32) int32 {
	if slot == nil {
		return -1
	}
	return *slot
}

// slotNote names a shared holding's slot in an Event; empty for an exclusive one.
func slotNote(slot *int32) string {
	if slot == nil {
		return ""
	}
	return fmt.Sprintf(", shared slot %d", *slot)
}

// deleteIdle deletes an idle auto-created lock, on condition that it is still
// the same object at the same resourceVersion: a lock used meanwhile stays.
// One an administrator wrote after its creator (writtenSinceCreated, from the
// live metadata: the cache keeps no managedFields) stays too.
func (r *Reconciler) deleteIdle(ctx context.Context, lock *locksv1alpha1.DistributedLock) (ctrl.Result, error) {
	live := &metav1.PartialObjectMetadata{}
	live.SetGroupVersionKind(lockGVK)
	switch err := r.apiReader.Get(ctx, client.ObjectKeyFromObject(lock), live); {
	case apierrors.IsNotFound(err):
		return ctrl.Result{}, nil
	case err != nil:
		metrics.ReconcileErrors.WithLabelValues(metrics.StepGet).Inc()
		return ctrl.Result{}, err
	case writtenSinceCreated(live):
		log.FromContext(ctx).V(1).Info("idle lock kept: written since its creation, by an administrator", "lock", client.ObjectKeyFromObject(lock))
		return ctrl.Result{}, nil
	}
	uid, rv := lock.UID, lock.ResourceVersion
	err := r.client.Delete(ctx, lock, client.Preconditions{UID: &uid, ResourceVersion: &rv})
	switch {
	case apierrors.IsConflict(err):
		metrics.WriteConflicts.Inc()
		return ctrl.Result{RequeueAfter: conflictRetry}, nil
	case apierrors.IsNotFound(err):
		return ctrl.Result{}, nil
	case err != nil:
		metrics.ReconcileErrors.WithLabelValues(metrics.StepDelete).Inc()
		return ctrl.Result{}, err
	}
	metrics.IdleLocksDeleted.Inc()
	log.FromContext(ctx).Info("idle auto-created lock deleted", "lock", client.ObjectKeyFromObject(lock),
		"token", lock.Status.FencingToken, "idleTimeout", r.timing.idleTimeout)
	r.recorder.Eventf(lock, nil, corev1.EventTypeNormal, EventDeleted, "Delete",
		"deleted auto-created lock idle for %s", r.timing.idleTimeout)
	return ctrl.Result{}, nil
}

// report counts and logs each holding, exclusive or shared, observed to begin
// or end, and emits an Event for it if the event policy reports its kind.
func (r *Reconciler) report(ctx context.Context, lock *locksv1alpha1.DistributedLock, ts []transition) {
	logger := log.FromContext(ctx)
	key := client.ObjectKeyFromObject(lock)
	for _, t := range ts {
		switch t.kind {
		case transitionAcquired:
			metrics.TransitionsObserved.WithLabelValues(EventAcquired).Inc()
			metrics.Acquisition(len(lock.Status.Waiters), t.waited.Seconds(), t.handoff.Seconds())
			metrics.Hot.Acquired(key.Namespace, key.Name)
			logger.Info("lock acquired", "lock", key, "holder", t.identity, "token", t.token, "leaseID", t.leaseID, "slot", slotValue(t.slot))
			if !r.events.reports(EventAcquired) {
				continue
			}
			r.recorder.Eventf(lock, nil, corev1.EventTypeNormal, EventAcquired, "Acquire",
				"acquired by %s with fencing token %d (lease %s%s)", t.identity, t.token, t.leaseID, slotNote(t.slot))
		case transitionEnded:
			reason := string(t.reason)
			if reason == "" {
				reason = EventReleased
			}
			metrics.TransitionsObserved.WithLabelValues(reason).Inc()
			logger.Info("holding ended", "lock", key, "holder", t.identity, "token", t.token, "leaseID", t.leaseID,
				"slot", slotValue(t.slot), "reason", reason, "endedBy", t.endedBy)
			if !r.events.reports(reason) {
				continue
			}
			r.recorder.Eventf(lock, nil, corev1.EventTypeNormal, reason, "Observe",
				"holding of %s with fencing token %d (lease %s%s) ended: %s by %s", t.identity, t.token, t.leaseID, slotNote(t.slot), reason, t.endedBy)
		}
	}
}

// Username is the controller's user name: the configured one, or its own,
// learned once with a SelfSubjectReview.
func (r *Reconciler) Username(ctx context.Context) (string, error) {
	if r.username != "" {
		return r.username, nil
	}
	return r.self.Username(ctx)
}

// The controller's metrics live in internal/metrics; this file connects the
// reconciler's observations and its leadership to them.

// leaderReporter is a manager runnable that needs leader election: the manager
// starts it when this replica becomes leader (at once without leader
// election) and stops it when leadership ends.
type leaderReporter struct {
	obs      *observations
	sessions *sessionObservations
	clock    interface{ Now() time.Time }
	grace    time.Duration
}

// NeedLeaderElection implements manager.LeaderElectionRunnable.
func (*leaderReporter) NeedLeaderElection() bool { return true }

// Start implements manager.Runnable.
func (l *leaderReporter) Start(ctx context.Context) error {
	l.obs.lead()
	l.sessions.lead()
	metrics.Leading(true)
	metrics.SetHoldingSource(func() metrics.HoldingStats { return l.obs.stats(l.clock.Now(), l.grace) })
	<-ctx.Done()
	metrics.Leading(false)
	metrics.SetHoldingSource(nil)
	// A replica that no longer leads stops reconciling; what it observed no
	// longer describes the fleet.
	l.obs.clear()
	l.sessions.clear()
	return nil
}

// stateOf is what the fleet gauges count of an observation (nil: none).
func stateOf(o *observation) metrics.LockState {
	if o == nil {
		return metrics.LockState{}
	}
	st := metrics.LockState{Exists: true, Waiters: len(o.waiters)}
	for _, h := range o.holdings {
		if h.slot == nil {
			st.Exclusive++
		} else {
			st.Shared++
		}
	}
	return st
}
