package validation

import (
	"slices"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

var (
	specPath    = field.NewPath("spec")
	statusPath  = field.NewPath("status")
	holderPath  = statusPath.Child("holder")
	sharedPath  = statusPath.Child("sharedHolders")
	waitersPath = statusPath.Child("waiters")
)

// ValidateLock checks l against the DistributedLock CRD's schema and its
// rules that do not compare with the stored object.
func ValidateLock(l *locksv1alpha1.DistributedLock) field.ErrorList {
	return lockErrs(l, nil).list
}

// ValidateLockUpdate is ValidateLock of newObj and the CRD's transition
// rules (those that compare with oldSelf).
func ValidateLockUpdate(newObj, oldObj *locksv1alpha1.DistributedLock) field.ErrorList {
	e := lockErrs(newObj, oldObj)
	n, o := &newObj.Spec, &oldObj.Spec
	e.valueRule(specPath.Child("type"), n.Type == o.Type, n.Type, "spec.type is immutable; create a new lock instead")
	if n.Permits != nil && o.Permits != nil {
		e.valueRule(specPath.Child("permits"), *n.Permits >= *o.Permits, *n.Permits, "spec.permits may grow but never shrink")
	}
	t := newObj.Status.FencingToken
	e.valueRule(statusPath.Child("fencingToken"), t >= oldObj.Status.FencingToken, t, "fencingToken must not decrease")
	return e.list
}

// lockErrs checks l against the schema and the object's rules; old is the
// stored object of an update, nil for a create.
func lockErrs(l, old *locksv1alpha1.DistributedLock) *errs {
	e := &errs{}
	var oldSpec *locksv1alpha1.DistributedLockSpec
	var oldStatus *locksv1alpha1.DistributedLockStatus
	if old != nil {
		oldSpec, oldStatus = &old.Spec, &old.Status
	}
	e.spec(&l.Spec, oldSpec)
	e.status(&l.Status)
	e.lockRules(l)
	e.caps(&l.Status, oldStatus)
	return e
}

// spec checks s; old is the stored spec of an update, nil for a create.
func (e *errs) spec(s, old *locksv1alpha1.DistributedLockSpec) {
	p := specPath
	var oldPermits, oldMaxWaiters, oldPerUser *int32
	if old != nil {
		oldPermits, oldMaxWaiters, oldPerUser = old.Permits, old.MaxWaiters, old.MaxWaitersPerUser
	}
	e.oneOf(p.Child("type"), string(s.Type), string(locksv1alpha1.Mutex), string(locksv1alpha1.RWMutex), string(locksv1alpha1.Semaphore))
	e.capped(p.Child("permits"), s.Permits, oldPermits, 1, locksv1alpha1.MaxSharedHolders)
	e.between(p.Child("leaseDurationSeconds"), int64(s.LeaseDurationSeconds), 1, locksv1alpha1.MaxLeaseDurationSeconds)
	e.between(p.Child("maxLeaseDurationSeconds"), int64(s.MaxLeaseDurationSeconds), 1, locksv1alpha1.MaxLeaseDurationSeconds)
	e.capped(p.Child("maxWaiters"), s.MaxWaiters, oldMaxWaiters, 0, locksv1alpha1.MaxWaitersLimit)
	e.between(p.Child("handoffTimeoutSeconds"), int64(s.HandoffTimeoutSeconds), 1, locksv1alpha1.MaxLeaseDurationSeconds)
	e.capped(p.Child("maxWaitersPerUser"), s.MaxWaitersPerUser, oldPerUser, 0, locksv1alpha1.MaxWaitersLimit)
	e.between(p.Child("maxWaitSeconds"), int64(s.MaxWaitSeconds), 1, locksv1alpha1.MaxWaitSecondsLimit)
	e.rule(p.Child("leaseDurationSeconds"), s.LeaseDurationSeconds <= s.MaxLeaseDurationSeconds,
		"spec.leaseDurationSeconds must not exceed spec.maxLeaseDurationSeconds")
	e.rule(p.Child("permits"), (s.Type == locksv1alpha1.Semaphore) == (s.Permits != nil),
		"spec.permits is required for a Semaphore and allowed only for it")
}

func (e *errs) status(s *locksv1alpha1.DistributedLockStatus) {
	if s.Holder != nil {
		e.holder(holderPath, s.Holder)
	}
	e.maxItems(sharedPath, len(s.SharedHolders), locksv1alpha1.StoredListLimit)
	slots := map[int32]bool{}
	for i := range s.SharedHolders {
		h, p := &s.SharedHolders[i], sharedPath.Index(i)
		e.holder(p, &h.LockHolder)
		e.atLeast(p.Child("fencingToken"), h.FencingToken, 1)
		e.between(p.Child("slot"), int64(h.Slot), 0, locksv1alpha1.StoredListLimit-1)
		unique(e, p, slots, "slot", h.Slot)
	}
	e.between(statusPath.Child("holderCount"), int64(s.HolderCount), 0, locksv1alpha1.StoredListLimit)
	e.atLeast(statusPath.Child("fencingToken"), s.FencingToken, 0)
	e.atLeast(statusPath.Child("transitions"), s.Transitions, 0)
	e.maxItems(waitersPath, len(s.Waiters), locksv1alpha1.StoredListLimit)
	requests := map[string]bool{}
	for i := range s.Waiters {
		e.waiter(waitersPath.Index(i), &s.Waiters[i])
		unique(e, waitersPath.Index(i), requests, "requestID", s.Waiters[i].RequestID)
	}
	e.between(statusPath.Child("waiterCount"), int64(s.WaiterCount), 0, locksv1alpha1.StoredListLimit)
	recent := statusPath.Child("recentAcquisitions")
	e.maxItems(recent, len(s.RecentAcquisitions), locksv1alpha1.MaxRecentAcquisitions)
	for i := range s.RecentAcquisitions {
		e.finished(recent.Index(i), &s.RecentAcquisitions[i])
	}
	e.atLeast(statusPath.Child("observedGeneration"), s.ObservedGeneration, 0)
	e.conditions(statusPath.Child("conditions"), s.Conditions)
	e.rule(statusPath, len(s.Waiters) == int(s.WaiterCount), "waiterCount must equal the number of waiters")
	holdings := len(s.SharedHolders)
	if s.Holder != nil {
		holdings++
	}
	e.rule(statusPath, holdings == int(s.HolderCount), "holderCount must equal the number of holdings, exclusive and shared")
}

// unique: a list-map key seen before is a duplicate entry, shown as the
// apiserver shows a list map's key ({"name": key}).
func unique[K comparable](e *errs, p *field.Path, seen map[K]bool, name string, key K) {
	if seen[key] {
		e.list = append(e.list, field.Duplicate(p, map[string]any{name: key}))
	}
	seen[key] = true
}

func (e *errs) holder(p *field.Path, h *locksv1alpha1.LockHolder) {
	e.text(p.Child("identity"), h.Identity, 1, 253, identityRE)
	e.text(p.Child("user"), h.User, 1, 512, nil)
	e.text(p.Child("leaseID"), h.LeaseID, 16, 64, leaseIDRE)
	e.text(p.Child("requestID"), h.RequestID, 1, 64, requestIDRE)
	e.between(p.Child("leaseDurationSeconds"), int64(h.LeaseDurationSeconds), 1, locksv1alpha1.MaxLeaseDurationSeconds)
	e.text(p.Child("podName"), h.PodName, 0, 253, podNameRE)
	e.text(p.Child("podUID"), h.PodUID, 0, 36, podUIDRE)
	e.text(p.Child("session"), h.Session, 0, 253, sessionRE)
	e.microTime(p.Child("acquireTime"), h.AcquireTime, true)
	if h.RenewTime != nil {
		e.microTime(p.Child("renewTime"), *h.RenewTime, false)
	}
}

func (e *errs) waiter(p *field.Path, w *locksv1alpha1.Waiter) {
	e.text(p.Child("identity"), w.Identity, 1, 253, identityRE)
	e.text(p.Child("user"), w.User, 1, 512, nil)
	e.text(p.Child("requestID"), w.RequestID, 1, 64, requestIDRE)
	e.microTime(p.Child("enqueueTime"), w.EnqueueTime, true)
	e.microTime(p.Child("deadline"), w.Deadline, true)
	e.text(p.Child("podName"), w.PodName, 0, 253, podNameRE)
	e.text(p.Child("podUID"), w.PodUID, 0, 36, podUIDRE)
	e.oneOf(p.Child("mode"), string(w.Mode), string(locksv1alpha1.Exclusive), string(locksv1alpha1.Shared))
	e.text(p.Child("session"), w.Session, 0, 253, sessionRE)
}

func (e *errs) finished(p *field.Path, f *locksv1alpha1.FinishedHolding) {
	e.text(p.Child("requestID"), f.RequestID, 1, 64, nil)
	e.text(p.Child("leaseID"), f.LeaseID, 1, 64, nil)
	e.atLeast(p.Child("fencingToken"), f.FencingToken, 1)
	e.text(p.Child("identity"), f.Identity, 1, 253, identityRE)
	e.microTime(p.Child("endTime"), f.EndTime, true)
	e.oneOf(p.Child("endReason"), string(f.EndReason), string(locksv1alpha1.EndReasonReleased), string(locksv1alpha1.EndReasonExpired),
		string(locksv1alpha1.EndReasonForceReleased), string(locksv1alpha1.EndReasonSessionExpired), string(locksv1alpha1.EndReasonSessionClosed))
	e.text(p.Child("endedBy"), f.EndedBy, 1, 512, nil)
	if f.Slot != nil {
		e.between(p.Child("slot"), int64(*f.Slot), 0, locksv1alpha1.StoredListLimit-1)
	}
	e.text(p.Child("message"), f.Message, 0, locksv1alpha1.MaxConditionMessage, nil)
}

// conditions: metav1.Condition's schema as controller-gen writes it, a list
// map keyed by type, and the list's rule on messages.
func (e *errs) conditions(p *field.Path, cs []metav1.Condition) {
	e.maxItems(p, len(cs), locksv1alpha1.MaxConditions)
	e.rule(p, !slices.ContainsFunc(cs, func(c metav1.Condition) bool {
		return utf8.RuneCountInString(c.Message) > locksv1alpha1.MaxConditionMessage
	}), "a condition's message is at most 256 characters")
	types := map[string]bool{}
	for i := range cs {
		c, q := &cs[i], p.Index(i)
		unique(e, q, types, "type", c.Type)
		// metav1.Condition's type has no minLength: its pattern refuses "".
		if c.Type == "" {
			e.schema(q.Child("type"), "", "should match '"+condTypeRE.String()+"'")
		} else {
			e.text(q.Child("type"), c.Type, 1, 316, condTypeRE)
		}
		e.oneOf(q.Child("status"), string(c.Status), string(metav1.ConditionTrue), string(metav1.ConditionFalse), string(metav1.ConditionUnknown))
		e.atLeast(q.Child("observedGeneration"), c.ObservedGeneration, 0)
		if c.LastTransitionTime.IsZero() {
			e.null(q.Child("lastTransitionTime"))
		}
		e.text(q.Child("reason"), c.Reason, 1, 1024, condReasonRE)
		e.text(q.Child("message"), c.Message, 0, 32768, nil)
	}
}

// capped checks an optional field whose maximum this release lowered: a
// value the stored object already has stays valid (the CRD ratchets it), so
// that a lock an earlier release stored, under its higher maximum, can
// still be written.
func (e *errs) capped(p *field.Path, v, old *int32, lo, hi int64) {
	if v == nil {
		return
	}
	if old != nil && *old == *v {
		hi = max(hi, int64(*v))
	}
	e.between(p, int64(*v), lo, hi)
}

// caps are the lists' rules: no write grows status.sharedHolders or
// status.waiters past its cap, though a lock stored with more (by an
// earlier release) keeps them; oldStatus is nil for a create.
func (e *errs) caps(s, oldStatus *locksv1alpha1.DistributedLockStatus) {
	var oldShared, oldWaiters int
	if oldStatus != nil {
		oldShared, oldWaiters = len(oldStatus.SharedHolders), len(oldStatus.Waiters)
	}
	n := len(s.SharedHolders)
	e.rule(sharedPath, n <= locksv1alpha1.MaxSharedHolders || n <= oldShared,
		"status.sharedHolders must not grow beyond 64 entries: a lock is one etcd value, and etcd refuses one over 1.5 MiB")
	n = len(s.Waiters)
	e.rule(waitersPath, n <= locksv1alpha1.MaxWaitersLimit || n <= oldWaiters,
		"status.waiters must not grow beyond 128 entries: a lock is one etcd value, and etcd refuses one over 1.5 MiB")
}

// lockRules are the object-level rules, which relate status to spec.
func (e *errs) lockRules(l *locksv1alpha1.DistributedLock) {
	s, spec := &l.Status, &l.Spec
	maxLease := spec.MaxLeaseDurationSeconds
	if s.Holder != nil {
		e.rule(holderPath.Child("leaseDurationSeconds"), s.Holder.LeaseDurationSeconds <= maxLease,
			"holder.leaseDurationSeconds must not exceed spec.maxLeaseDurationSeconds")
	}
	if len(s.Waiters) > 0 && spec.MaxWaiters != nil {
		e.rule(waitersPath, len(s.Waiters) <= int(*spec.MaxWaiters), "the wait queue must not be longer than spec.maxWaiters")
	}
	longest, highest := int32(0), int32(-1)
	for _, h := range s.SharedHolders {
		longest, highest = max(longest, h.LeaseDurationSeconds), max(highest, h.Slot)
	}
	e.rule(sharedPath, longest <= maxLease, "a shared holding's leaseDurationSeconds must not exceed spec.maxLeaseDurationSeconds")
	shared := len(s.SharedHolders) > 0
	switch spec.Type {
	case locksv1alpha1.Mutex:
		e.rule(sharedPath, !shared, "a Mutex has no shared holders")
	case locksv1alpha1.RWMutex:
		e.rule(holderPath, s.Holder == nil || !shared, "an RWMutex has a writer or readers, never both")
	case locksv1alpha1.Semaphore:
		e.rule(holderPath, s.Holder == nil, "a Semaphore has no exclusive holder; its permits are shared holdings")
		if shared && spec.Permits != nil {
			e.rule(sharedPath, len(s.SharedHolders) <= int(*spec.Permits) && highest < *spec.Permits,
				"a Semaphore has at most spec.permits holders, on slots in [0, permits)")
		}
	}
	if spec.Type != locksv1alpha1.RWMutex {
		wrong := locksv1alpha1.Exclusive
		if spec.Type == locksv1alpha1.Mutex {
			wrong = locksv1alpha1.Shared
		}
		e.rule(waitersPath, !slices.ContainsFunc(s.Waiters, func(w locksv1alpha1.Waiter) bool { return w.Mode == wrong }),
			"a Mutex's waiters are Exclusive and a Semaphore's are Shared")
	}
}
