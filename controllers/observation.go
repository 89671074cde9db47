package controllers

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/internal/metrics"
)

// observation is what this controller process has seen of one lock, with the
// times of its own clock at which it first saw each value. It is the only input
// to expiry and queue decisions besides the lock itself: nothing is decided by
// comparing timestamps written by other components with this clock.
//
// Observations live in memory only. A replica observes from its start, leader
// or not (warmup.go), so a new leader's lease of a holding runs from the last
// renewal it saw as a standby; one that starts has none, and sees every
// holding, waiter and hand-off as new "now". Either way it can only ever expire
// later than a controller that watched all along, never earlier.
type observation struct {
	// uid tells a lock apart from an earlier object of the same name.
	uid types.UID
	// resourceVersion is the newest version observed; older cache reads are skipped.
	resourceVersion string
	// token is the fencing token last seen (the latest issued); holdings with
	// a larger one that already ended were missed between two observations.
	token int64
	// holdings maps the leaseID of each current holding, the exclusive holder
	// and every shared holder alike, to what was seen of it: each entry's lease
	// is timed on its own, keyed by (lock, leaseID).
	holdings map[string]holdingObservation
	// waiters maps each queued requestID to when this controller first saw it queued.
	waiters map[string]time.Time
	// readyHead is the head waiter while the lock was seen admitting a holding
	// in the head's mode (v1alpha1 Admits), "" otherwise; first seen so at
	// readyHeadSince. Its hand-off time runs from there.
	readyHead      string
	readyHeadSince time.Time
	// idle: the lock was seen free with an empty queue, first at idleSince
	// with fencing token idleToken (a new token means it was used).
	idle      bool
	idleToken int64
	idleSince time.Time
}

// holdingObservation is one holding, exclusive or shared, as this controller saw it.
type holdingObservation struct {
	leaseID, identity, requestID string
	token                        int64
	// slot is a shared holding's permit; nil for the exclusive holder.
	slot *int32
	// renewMark identifies the holding's last renewal (its renewTime, else acquireTime).
	renewMark int64
	// renewSeen is when this controller first saw renewMark: the lease runs from here.
	renewSeen time.Time
	// For metrics only: when this controller first saw the holding, its lease
	// duration, and whether it lives as long as its session instead.
	since     time.Time
	lease     time.Duration
	inSession bool
}

// transitionKind names an observed change of holdings.
type transitionKind string

const (
	transitionAcquired transitionKind = "Acquired"
	transitionEnded    transitionKind = "Ended"
)

// transition is a holding that began or ended between two observations.
type transition struct {
	kind              transitionKind
	leaseID, identity string
	token             int64
	// slot is a shared holding's permit; nil for an exclusive one.
	slot *int32
	// reason and endedBy come from recentAcquisitions for an ended holding;
	// reason is empty when status no longer remembers it.
	reason  locksv1alpha1.EndReason
	endedBy string
	// waited is how long an acquirer had been seen queued, 0 if it never was.
	waited time.Duration
	// handoff is how long the lock had been seen admitting the acquirer at
	// the head of the queue, 0 if it was not seen so.
	handoff time.Duration
}

// headMode is the mode the queue's head waits for: its mode, or the lock's
// default for an entry written without one (the CRD defaults it to Exclusive).
func headMode(lock *locksv1alpha1.DistributedLock, w *locksv1alpha1.Waiter) locksv1alpha1.Mode {
	if w.Mode != "" {
		return w.Mode
	}
	return lock.DefaultMode()
}

// isStale reports whether lock is older than what prev already observed, as
// happens when the cache has not yet caught up with this controller's own write.
func isStale(prev *observation, lock *locksv1alpha1.DistributedLock) bool {
	if prev == nil || prev.uid != lock.UID || prev.resourceVersion == "" {
		return false
	}
	c, err := resourceversion.CompareResourceVersion(lock.ResourceVersion, prev.resourceVersion)
	return err == nil && c < 0
}

// observe folds lock, seen at now, into the previous observation prev (nil when
// there is none) and returns the new observation and the holding transitions
// between the two. A first observation reports no transitions: what happened
// before it is unknown.
func observe(prev *observation, lock *locksv1alpha1.DistributedLock, now time.Time) (observation, []transition) {
	if prev != nil && prev.uid != lock.UID {
		prev = nil
	}
	if prev == nil {
		prev = &observation{}
	}
	s := &lock.Status
	next := observation{uid: lock.UID, resourceVersion: lock.ResourceVersion, token: s.FencingToken}
	var ts []transition

	// 1. The holdings: each lease runs from when this controller first saw
	// that holding's last renewal; a renewal of one moves no other.
	hs := lock.Status.Holdings()
	if len(hs) > 0 {
		next.holdings = make(map[string]holdingObservation, len(hs))
	}
	for _, h := range hs {
		mark := renewMark(h.LockHolder)
		o := holdingObservation{leaseID: h.LeaseID, identity: h.Identity, requestID: h.RequestID, token: h.Token, slot: h.Slot,
			renewMark: mark, renewSeen: now, since: now, lease: seconds(h.LeaseDurationSeconds), inSession: h.Session != ""}
		if p, ok := prev.holdings[h.LeaseID]; ok {
			o.since = p.since
			if p.renewMark == mark {
				o.renewSeen = p.renewSeen
			}
		}
		next.holdings[h.LeaseID] = o
	}
	if prev.uid != "" {
		ts = holdingTransitions(prev, hs, s, now)
	}

	// 2. The queue: each waiter's wait runs from when it was first seen queued.
	if len(s.Waiters) > 0 {
		next.waiters = make(map[string]time.Time, len(s.Waiters))
		for _, w := range s.Waiters {
			seen, ok := prev.waiters[w.RequestID]
			if !ok {
				seen = now
			}
			next.waiters[w.RequestID] = seen
		}
	}

	// 3. Hand-off: the head has handoffTimeoutSeconds from when it was seen at
	// the head of a lock that admits a holding in its mode (a free lock for an
	// exclusive head; no writer and a free slot for a shared one).
	if len(s.Waiters) > 0 && lock.Admits(headMode(lock, &s.Waiters[0])) {
		next.readyHead, next.readyHeadSince = s.Waiters[0].RequestID, now
		if prev.readyHead == next.readyHead {
			next.readyHeadSince = prev.readyHeadSince
		}
	}

	// 4. Idleness: no holding, nobody queued, and no acquisition since (same token).
	if !lock.IsHeld() && len(s.Waiters) == 0 {
		next.idle, next.idleToken, next.idleSince = true, s.FencingToken, now
		if prev.idle && prev.idleToken == s.FencingToken {
			next.idleSince = prev.idleSince
		}
	}
	return next, ts
}

// holdingTransitions lists the holdings that ended since the previous
// observation (by token), those that began and ended in between (known from
// recentAcquisitions, in the order they ended), and the current holdings that
// began (by token).
func holdingTransitions(prev *observation, current []locksv1alpha1.Holding, s *locksv1alpha1.DistributedLockStatus, now time.Time) []transition {
	var ts []transition
	live := make(map[string]bool, len(current))
	for _, h := range current {
		live[h.LeaseID] = true
	}
	var ended []holdingObservation
	for id, p := range prev.holdings {
		if !live[id] {
			ended = append(ended, p)
		}
	}
	slices.SortFunc(ended, func(a, b holdingObservation) int { return cmp.Compare(a.token, b.token) })
	for _, p := range ended {
		t := transition{kind: transitionEnded, leaseID: p.leaseID, identity: p.identity, token: p.token, slot: p.slot}
		if f := finished(s, p.leaseID); f != nil {
			t.reason, t.endedBy = f.EndReason, f.EndedBy
		}
		ts = append(ts, t)
	}
	for _, f := range s.RecentAcquisitions {
		if _, seen := prev.holdings[f.LeaseID]; f.FencingToken > prev.token && !seen {
			ts = append(ts,
				transition{kind: transitionAcquired, leaseID: f.LeaseID, identity: f.Identity, token: f.FencingToken, slot: f.Slot},
				transition{kind: transitionEnded, leaseID: f.LeaseID, identity: f.Identity, token: f.FencingToken, slot: f.Slot, reason: f.EndReason, endedBy: f.EndedBy})
		}
	}
	var began []transition
	for _, h := range current {
		if _, seen := prev.holdings[h.LeaseID]; seen {
			continue
		}
		t := transition{kind: transitionAcquired, leaseID: h.LeaseID, identity: h.Identity, token: h.Token, slot: h.Slot}
		if queued, ok := prev.waiters[h.RequestID]; ok {
			t.waited = now.Sub(queued)
		}
		if prev.readyHead == h.RequestID {
			t.handoff = now.Sub(prev.readyHeadSince)
		}
		began = append(began, t)
	}
	slices.SortFunc(began, func(a, b transition) int { return cmp.Compare(a.token, b.token) })
	return append(ts, began...)
}

// finished is the record of the ended holding leaseID, nil when status no longer remembers it.
func finished(s *locksv1alpha1.DistributedLockStatus, leaseID string) *locksv1alpha1.FinishedHolding {
	for i := range s.RecentAcquisitions {
		if s.RecentAcquisitions[i].LeaseID == leaseID {
			return &s.RecentAcquisitions[i]
		}
	}
	return nil
}

// renewMark identifies a holding's latest renewal. Only equality matters: a
// renewal is any change of renewTime, whichever way the holder's clock moved.
func renewMark(h *locksv1alpha1.LockHolder) int64 {
	if h.RenewTime != nil {
		return h.RenewTime.UnixMicro()
	}
	return h.AcquireTime.UnixMicro()
}

// observations is the per-lock memory of one controller process, safe for
// concurrent reconciles (of different locks).
type observations struct {
	mu sync.Mutex
	m  map[types.NamespacedName]*observation
	// counted: this replica leads (lead), and the fleet gauges count what it
	// observes; a standby's observations count nowhere.
	counted bool
}

// lead counts every observation in the fleet gauges from now on.
func (o *observations) lead() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.counted = true
	for key, obs := range o.m {
		countLock(key, nil, obs)
	}
}

// countLock moves the fleet gauges from before to after (nil: none).
func countLock(key types.NamespacedName, before, after *observation) {
	metrics.LockChanged(stateOf(before), stateOf(after))
	if after == nil {
		metrics.Hot.Forget(key.Namespace, key.Name)
		return
	}
	metrics.Hot.SetWaiters(key.Namespace, key.Name, len(after.waiters))
}

// observeStandby folds lock, received at seen, into what was observed of it,
// as Reconcile does but reporting nothing, unless this replica leads: then
// its controller folds every version itself, and reports what changed.
func (o *observations) observeStandby(key types.NamespacedName, lock *locksv1alpha1.DistributedLock, seen time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	prev := o.m[key]
	if o.counted || isStale(prev, lock) {
		return
	}
	next, _ := observe(prev, lock, seen)
	if o.m == nil {
		o.m = make(map[types.NamespacedName]*observation)
	}
	o.m[key] = &next
}

func (o *observations) get(key types.NamespacedName) *observation {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.m[key]
}

func (o *observations) put(key types.NamespacedName, obs observation) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m = make(map[types.NamespacedName]*observation)
	}
	if o.counted {
		countLock(key, o.m[key], &obs)
	}
	o.m[key] = &obs
}

func (o *observations) forget(key types.NamespacedName) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.counted {
		countLock(key, o.m[key], nil)
	}
	delete(o.m, key)
}

// clear forgets every observation, as a controller that stops leading.
func (o *observations) clear() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.counted {
		for key, obs := range o.m {
			countLock(key, obs, nil)
		}
	}
	o.m, o.counted = nil, false
}

// stats summarises the current holdings, exclusive and shared, at now for
// the holding gauges; grace is the controller's expiry grace. It walks every
// observation, once per scrape.
func (o *observations) stats(now time.Time, grace time.Duration) metrics.HoldingStats {
	o.mu.Lock()
	defer o.mu.Unlock()
	var s metrics.HoldingStats
	for _, obs := range o.m {
		for _, h := range obs.holdings {
			if h.lease <= 0 || h.inSession {
				continue
			}
			s.LongestLeases = max(s.LongestLeases, float64(now.Sub(h.since))/float64(h.lease))
			s.MaxOverdueSeconds = max(s.MaxOverdueSeconds, now.Sub(h.renewSeen.Add(h.lease+grace)).Seconds())
		}
	}
	return s
}

// sessionObservation is what this controller has seen of one session's
// renewals, on its own clock, as observation is for a lock's lease.
type sessionObservation struct {
	uid types.UID
	// renewMark identifies the owner's last renewal (its renewTime, 0 before the first).
	renewMark int64
	// renewSeen is when this controller first saw renewMark: the TTL runs from
	// here. A new session counts as renewed when first seen.
	renewSeen time.Time
}

// observeSession folds session s, seen at now, into prev (nil when there is none).
func observeSession(prev *sessionObservation, s *locksv1alpha1.LockSession, now time.Time) sessionObservation {
	var mark int64
	if s.Status.RenewTime != nil {
		mark = s.Status.RenewTime.UnixMicro()
	}
	if prev != nil && prev.uid == s.UID && prev.renewMark == mark {
		return *prev
	}
	return sessionObservation{uid: s.UID, renewMark: mark, renewSeen: now}
}

// sessionObservations is the per-session memory of one controller process,
// shared by the session and the lock reconciler: whichever reads a session
// first folds it in, so neither judges a renewal the other has not recorded.
type sessionObservations struct {
	mu sync.Mutex
	m  map[types.NamespacedName]sessionObservation
	// counted: this replica leads, and SessionsObserved counts them.
	counted bool
}

// lead counts every observed session from now on.
func (o *sessionObservations) lead() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.counted = true
	metrics.SessionsObserved.Add(float64(len(o.m)))
}

// observe folds s, seen at now, into what was observed of it and returns the result.
func (o *sessionObservations) observe(s *locksv1alpha1.LockSession, now time.Time) sessionObservation {
	key := types.NamespacedName{Namespace: s.Namespace, Name: s.Name}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m = make(map[types.NamespacedName]sessionObservation)
	}
	var prev *sessionObservation
	if p, ok := o.m[key]; ok {
		prev = &p
	} else if o.counted {
		metrics.SessionsObserved.Inc()
	}
	next := observeSession(prev, s, now)
	o.m[key] = next
	return next
}

func (o *sessionObservations) forget(key types.NamespacedName) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, ok := o.m[key]; ok && o.counted {
		metrics.SessionsObserved.Dec()
	}
	delete(o.m, key)
}

// clear forgets every session, as a controller that stops leading.
func (o *sessionObservations) clear() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.counted {
		metrics.SessionsObserved.Add(float64(-len(o.m)))
	}
	o.m, o.counted = nil, false
}
