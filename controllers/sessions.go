package controllers

import (
	"context"
	"errors"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/internal/metrics"
)

// SessionControllerName names the LockSession controller (logs, metrics).
const SessionControllerName = "locksession"

// Field indexes of the lock cache, so that the work a session or pod event
// causes scales with the locks that name it, never with all locks.
// The holding indexes cover the exclusive holder and every shared holder;
// indexPodUID covers them and the waiters.
const (
	indexHoldingSession = "status.holdings.session"
	indexWaiterSession  = "status.waiters.session"
	indexPodUID         = "status.podUID"
)

// +kubebuilder:rbac:groups=locks.kubelock.io,resources=locksessions,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups=locks.kubelock.io,resources=locksessions/status,verbs=update;patch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch

// sessionReconciler times each LockSession's renewals, keeps its status.locks
// and, when it lapsed, has the locks in it end their holdings and drop its
// waiters before it deletes it.
type sessionReconciler struct {
	client   client.Client
	reader   client.Reader // the manager's cache
	clock    clock.PassiveClock
	grace    time.Duration
	sessions *sessionObservations
	// kick enqueues a lock in the lock controller.
	kick chan<- event.GenericEvent
}

// Reconcile brings one session up to date with the controller's observations.
func (r *sessionReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	s := &locksv1alpha1.LockSession{}
	if err := r.reader.Get(ctx, req.NamespacedName, s); err != nil {
		if apierrors.IsNotFound(err) {
			r.sessions.forget(req.NamespacedName)
			return ctrl.Result{}, nil
		}
		metrics.ReconcileErrors.WithLabelValues(metrics.StepGet).Inc()
		return ctrl.Result{}, err
	}
	if s.DeletionTimestamp != nil {
		// Its locks end SessionClosed: the lock controller watches deletions.
		return ctrl.Result{}, nil
	}
	now := r.clock.Now()
	seen := r.sessions.observe(s, now)
	holdings, refs, err := locksNaming(ctx, r.reader, s)
	if err != nil {
		return ctrl.Result{}, err
	}
	d := decideSession(s, seen, holdings, len(refs), now, r.grace)
	logger := log.FromContext(ctx)
	switch {
	case d.delete:
		uid := s.UID
		if err := r.client.Delete(ctx, s, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) {
			metrics.ReconcileErrors.WithLabelValues(metrics.StepDelete).Inc()
			return ctrl.Result{}, err
		}
		metrics.SessionsExpired.Inc()
		r.sessions.forget(req.NamespacedName)
		logger.Info("session expired and deleted", "session", req.NamespacedName, "user", s.Spec.User, "ttlSeconds", s.TTL())
		return ctrl.Result{}, nil
	case d.lapsed:
		logger.V(1).Info("session lapsed; ending its holdings and waiters first", "session", req.NamespacedName, "locks", len(refs))
		for _, key := range refs {
			l := &cachedLock{}
			l.Namespace, l.Name = key.Namespace, key.Name
			select {
			case r.kick <- event.GenericEvent{Object: l}:
			case <-ctx.Done():
				return ctrl.Result{}, ctx.Err()
			}
		}
	case d.locks != nil:
		patched := s.DeepCopy()
		patched.Status.Locks = *d.locks
		if err := r.client.Status().Patch(ctx, patched, client.MergeFrom(s)); err != nil && !apierrors.IsNotFound(err) {
			metrics.ReconcileErrors.WithLabelValues(metrics.StepWrite).Inc()
			return ctrl.Result{}, err
		}
	}
	return ctrl.Result{RequeueAfter: d.requeueAfter}, nil
}

// indexLocks adds the lock cache's field indexes. A lock that does not
// decode names no session or pod.
func indexLocks(ctx context.Context, idx client.FieldIndexer) error {
	// Only values that can name an object: no event ever looks up another.
	distinct := func(values func(*locksv1alpha1.DistributedLock) []string, valid func(string) bool) client.IndexerFunc {
		return func(o client.Object) []string {
			l, _ := o.(*cachedLock)
			if l == nil {
				return nil
			}
			var out []string
			for _, v := range values(&l.DistributedLock) {
				if valid(v) && !slices.Contains(out, v) {
					out = append(out, v)
				}
			}
			return out
		}
	}
	for field, fn := range map[string]client.IndexerFunc{
		indexHoldingSession: distinct(func(l *locksv1alpha1.DistributedLock) []string {
			return holdingFields(l, func(h *locksv1alpha1.LockHolder) string { return h.Session })
		}, validSessionName),
		indexPodUID:        distinct(podUIDs, validUID),
		indexWaiterSession: distinct(waiterSessions, validSessionName),
	} {
		if err := idx.IndexField(ctx, &cachedLock{}, field, fn); err != nil {
			return err
		}
	}
	return nil
}

// holdingFields lists field of each of a lock's holdings, the exclusive
// holder and the shared holders, one value per holding ("" where unset).
func holdingFields(l *locksv1alpha1.DistributedLock, field func(*locksv1alpha1.LockHolder) string) []string {
	hs := l.Status.Holdings()
	out := make([]string, len(hs))
	for i := range hs {
		out[i] = field(hs[i].LockHolder)
	}
	return out
}

// waiterSessions lists the session of each of a lock's waiters ("" where unset).
// podUIDs lists the pods a lock's holdings and waiters are bound to: a pod's
// deletion ends those of them without a session (and a session's, through
// the session).
func podUIDs(l *locksv1alpha1.DistributedLock) []string {
	out := holdingFields(l, func(h *locksv1alpha1.LockHolder) string { return h.PodUID })
	for _, w := range l.Status.Waiters {
		out = append(out, w.PodUID)
	}
	return out
}

func waiterSessions(l *locksv1alpha1.DistributedLock) []string {
	out := make([]string, len(l.Status.Waiters))
	for i, w := range l.Status.Waiters {
		out[i] = w.Session
	}
	return out
}

// sessionRef is how a lock names one session: in how many of its holdings,
// and whether in a waiter.
type sessionRef struct {
	holdings int
	waits    bool
}

// sessionRefs lists the sessions a lock names; none for one that did not
// decode, and no name a LockSession cannot have (so none is enqueued).
func sessionRefs(o client.Object) map[string]sessionRef {
	refs := map[string]sessionRef{}
	c, _ := o.(*cachedLock)
	if c == nil {
		return refs
	}
	l := &c.DistributedLock
	for _, s := range holdingFields(l, func(h *locksv1alpha1.LockHolder) string { return h.Session }) {
		if validSessionName(s) {
			r := refs[s]
			r.holdings++
			refs[s] = r
		}
	}
	for _, s := range waiterSessions(l) {
		if validSessionName(s) {
			r := refs[s]
			r.waits = true
			refs[s] = r
		}
	}
	return refs
}

// listLocks returns the locks in namespace ns ("" for all) whose index field has value.
func listLocks(ctx context.Context, reader client.Reader, ns, field, value string) ([]cachedLock, error) {
	list := &cachedLockList{}
	if err := reader.List(ctx, list, client.InNamespace(ns), client.MatchingFields{field: value}); err != nil {
		return nil, err
	}
	return list.Items, nil
}

// locksNaming counts the holdings in session s (the exclusive and shared
// holdings of every lock, as status.locks reports them) and lists the locks
// whose holdings or waiters name it.
func locksNaming(ctx context.Context, reader client.Reader, s client.Object) (holdings int, refs []types.NamespacedName, err error) {
	held, err1 := listLocks(ctx, reader, s.GetNamespace(), indexHoldingSession, s.GetName())
	waiting, err2 := listLocks(ctx, reader, s.GetNamespace(), indexWaiterSession, s.GetName())
	for i := range held {
		holdings += sessionRefs(&held[i])[s.GetName()].holdings
	}
	for _, l := range append(held, waiting...) {
		if k := client.ObjectKeyFromObject(&l); !slices.Contains(refs, k) {
			refs = append(refs, k)
		}
	}
	return holdings, refs, errors.Join(err1, err2)
}

func requests(keys []types.NamespacedName) []reconcile.Request {
	out := make([]reconcile.Request, len(keys))
	for i, k := range keys {
		out[i] = reconcile.Request{NamespacedName: k}
	}
	return out
}

// locksOfSession maps a session event to the locks that name it.
func (r *Reconciler) locksOfSession(ctx context.Context, o client.Object) []reconcile.Request {
	_, refs, err := locksNaming(ctx, r.reader, o)
	if err != nil {
		log.FromContext(ctx).Error(err, "cannot list the locks of a session", "session", client.ObjectKeyFromObject(o))
	}
	return requests(refs)
}

// locksOfPod maps a pod's deletion to the locks it holds (exclusive or shared).
func (r *Reconciler) locksOfPod(ctx context.Context, o client.Object) []reconcile.Request {
	locks, err := listLocks(ctx, r.reader, "", indexPodUID, string(o.GetUID()))
	if err != nil {
		log.FromContext(ctx).Error(err, "cannot list the locks of a pod", "pod", client.ObjectKeyFromObject(o))
	}
	keys := make([]types.NamespacedName, len(locks))
	for i := range locks {
		keys[i] = client.ObjectKeyFromObject(&locks[i])
	}
	return requests(keys)
}

// sessionEnding passes the session events a lock must act on: not renewals
// (status writes), only a session's creation, deletion or start of deletion.
var sessionEnding = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		return (e.ObjectOld.GetDeletionTimestamp() == nil) != (e.ObjectNew.GetDeletionTimestamp() == nil)
	},
}

// podDeleted passes only the deletion of a pod (gone from the API, not terminating:
// a terminating holder may still release its locks itself).
var podDeleted = predicate.Funcs{
	CreateFunc:  func(event.CreateEvent) bool { return false },
	UpdateFunc:  func(event.UpdateEvent) bool { return false },
	GenericFunc: func(event.GenericEvent) bool { return false },
}

// sessionsOfLock enqueues the sessions whose holdings or waiters a lock event
// changed: a write that leaves a lock's sessions alone enqueues none.
var sessionsOfLock = handler.Funcs{
	CreateFunc: func(_ context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		enqueueSessions(q, e.Object, nil, sessionRefs(e.Object))
	},
	UpdateFunc: func(_ context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		enqueueSessions(q, e.ObjectNew, sessionRefs(e.ObjectOld), sessionRefs(e.ObjectNew))
	},
	DeleteFunc: func(_ context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		enqueueSessions(q, e.Object, sessionRefs(e.Object), nil)
	},
}

func enqueueSessions(q workqueue.TypedRateLimitingInterface[reconcile.Request], lock client.Object, before, after map[string]sessionRef) {
	for name, n := range after {
		if before[name] != n {
			q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: lock.GetNamespace(), Name: name}})
		}
	}
	for name := range before {
		if _, ok := after[name]; !ok {
			q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: lock.GetNamespace(), Name: name}})
		}
	}
}

// liveness reads what lock's holdings and waiters depend on: the sessions
// they name and, for those bound to a pod without a session, whether that pod
// is gone. A reference that cannot name an object is not read (refs.go). A
// read that fails is logged and counted, and leaves that session or pod
// unknown: decide keeps the entries that depend on it as they are and
// decides the rest of the lock. failed reports whether any read failed, for
// the reconcile to retry.
func (r *Reconciler) liveness(ctx context.Context, lock *locksv1alpha1.DistributedLock, now time.Time) (live liveness, failed bool) {
	logger := log.FromContext(ctx).WithValues("lock", client.ObjectKeyFromObject(lock))
	for _, name := range sessionsNamed(lock) {
		key := types.NamespacedName{Namespace: lock.Namespace, Name: name}
		st, err := r.session(ctx, key, now)
		if err != nil {
			failed = true
			metrics.EntryErrors.WithLabelValues(metrics.EntrySession).Inc()
			logger.Error(err, "cannot read a session the lock's entries name; they stay as they are until a retry reads it", "session", key)
			continue
		}
		if live.sessions == nil {
			live.sessions = map[string]sessionState{}
		}
		live.sessions[name] = st
	}
	for _, p := range podsBound(lock) {
		if _, checked := live.podsGone[p]; checked {
			continue
		}
		gone, err := r.podGone(ctx, p)
		if err != nil {
			failed = true
			metrics.EntryErrors.WithLabelValues(metrics.EntryPod).Inc()
			logger.Error(err, "cannot read the pod of the lock's entries; they stay as they are until a retry reads it", "pod", p.key, "podUID", p.uid)
			continue
		}
		if live.podsGone == nil {
			live.podsGone = map[podRef]bool{}
		}
		live.podsGone[p] = gone
	}
	return live, failed
}

// sessionsNamed lists the sessions lock's holdings and waiters name, each
// once, leaving out names no LockSession can have.
func sessionsNamed(lock *locksv1alpha1.DistributedLock) []string {
	var names []string
	for _, name := range append(holdingFields(lock, func(h *locksv1alpha1.LockHolder) string { return h.Session }), waiterSessions(lock)...) {
		if validSessionName(name) && !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	return names
}

// podsBound lists the pods lock's holdings and waiters without a session
// are bound to, each once.
func podsBound(lock *locksv1alpha1.DistributedLock) []podRef {
	var refs []podRef
	add := func(user, podName, podUID string) {
		if p, b := podOf(user, podName, podUID); b == podBound && !slices.Contains(refs, p) {
			refs = append(refs, p)
		}
	}
	for _, h := range lock.Status.Holdings() {
		if h.Session == "" {
			add(h.User, h.PodName, h.PodUID)
		}
	}
	for _, w := range lock.Status.Waiters {
		if w.Session == "" {
			add(w.User, w.PodName, w.PodUID)
		}
	}
	return refs
}

// session reads a session from the cache and folds it into the observations.
// One the cache lacks is read live before it counts as missing: the cache may
// not yet have a session created a moment ago.
func (r *Reconciler) session(ctx context.Context, key types.NamespacedName, now time.Time) (sessionState, error) {
	st := sessionState{name: key.Name}
	s := &locksv1alpha1.LockSession{}
	err := r.reader.Get(ctx, key, s)
	if apierrors.IsNotFound(err) {
		err = r.apiReader.Get(ctx, key, s)
	}
	switch {
	case apierrors.IsNotFound(err):
		return st, nil
	case err != nil:
		return st, err
	}
	st.session, st.seen = s, r.sessions.observe(s, now)
	return st, nil
}

// podGone reports whether pod p no longer exists (none of its name, or one
// of another UID). What the cache says is confirmed with a live read before
// a holding or a waiter is ended on it.
func (r *Reconciler) podGone(ctx context.Context, p podRef) (bool, error) {
	pod := podMetadata()
	err := r.reader.Get(ctx, p.key, pod)
	if err == nil && string(pod.UID) == p.uid {
		return false, nil
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return false, err
	}
	err = r.apiReader.Get(ctx, p.key, pod)
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	return err == nil && string(pod.UID) != p.uid, err
}
