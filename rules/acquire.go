package rules

import (
	"k8s.io/apimachinery/pkg/util/validation/field"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// Fixed messages of the acquire rules; config/policy gives the same words.
const (
	msgOneAcquisition  = "one write may acquire at most one holding: the exclusive holder or one shared holder"
	msgBothModes       = "a lock is held exclusively or shared, never both: status.holder and status.sharedHolders cannot be set together"
	msgMutexShared     = "a Mutex is held only Exclusive: it has no shared holders"
	msgSemaphoreHolder = "a Semaphore is held only Shared: its permits are status.sharedHolders, never status.holder"
	msgAcquirerQueued  = "an acquisition takes its own entry out of the wait queue in the same write: its requestID may not stay in status.waiters (or join it)"
	msgRequestID       = "a new holding or queue entry needs a fresh requestID: it must differ from the holder's, from every shared holder's and from every requestID in status.recentAcquisitions"
	msgLeaseID         = "an acquisition needs a fresh leaseID: it must differ from the current holder's, from every shared holder's and from every leaseID in status.recentAcquisitions"
	msgTerminating     = "the lock is being deleted (metadata.deletionTimestamp is set): it cannot be acquired and nobody may join its queue"
)

// validateAcquire checks the holdings a write has and adds: they fit the
// lock's type, shared ones on slots of their own, at most one new one, and
// the token moves only with an acquisition.
func validateAcquire(oldObj, newObj *locksv1alpha1.DistributedLock, d holdings, a Actor) field.ErrorList {
	o, n := &oldObj.Status, &newObj.Status
	errs := validateModes(newObj, d)
	switch len(d.acquired) {
	case 0:
		if n.FencingToken != o.FencingToken {
			errs = append(errs, deny(tokenPath, RuleFencingToken, "fencingToken changes only when a lock is acquired; it is %d", o.FencingToken))
		}
	case 1:
		errs = append(errs, validateAcquisition(oldObj, newObj, d, a)...)
	default:
		errs = append(errs, deny(statusPath, RuleSlot, msgOneAcquisition))
	}
	return errs
}

// validateModes checks that the holdings fit the lock's type (rule mode) and
// that shared entries sit on distinct slots in range (rule slot). The CRD
// keeps the same invariants; they are here too so that the pure rules (and
// their fuzzing) stand on their own.
func validateModes(l *locksv1alpha1.DistributedLock, d holdings) field.ErrorList {
	var errs field.ErrorList
	n := &l.Status
	switch {
	case n.Holder != nil && !l.Supports(locksv1alpha1.Exclusive):
		errs = append(errs, deny(holderPath, RuleMode, msgSemaphoreHolder))
	case len(n.SharedHolders) > 0 && !l.Supports(locksv1alpha1.Shared):
		errs = append(errs, deny(sharedPath, RuleMode, msgMutexShared))
	case n.Holder != nil && len(n.SharedHolders) > 0:
		errs = append(errs, deny(sharedPath, RuleMode, msgBothModes))
	}
	limit := int32(l.SharedLimit())
	seen := make(map[int32]bool, len(n.SharedHolders))
	for i, e := range n.SharedHolders {
		p := sharedPath.Index(i).Child("slot")
		if seen[e.Slot] {
			errs = append(errs, deny(p, RuleSlot, "slot %d is taken: every shared holding has a slot of its own", e.Slot))
		}
		seen[e.Slot] = true
	}
	for _, a := range d.acquired {
		if a.shared != nil && (a.shared.Slot < 0 || a.shared.Slot >= limit) {
			errs = append(errs, deny(a.path.Child("slot"), RuleSlot, "slot %d is out of range: a new shared holding takes a free slot in [0, %d)", a.shared.Slot, limit))
		}
	}
	return errs
}

// validateAcquisition checks the one holding a write adds: by whom, for
// whom, its token, its lease ID and its place in the queue.
func validateAcquisition(oldObj, newObj *locksv1alpha1.DistributedLock, d holdings, a Actor) field.ErrorList {
	var errs field.ErrorList
	o, n := &oldObj.Status, &newObj.Status
	acq := d.acquired[0]
	h, what := acq.h, acq.what()
	if a.IsController {
		errs = append(errs, deny(acq.path, RuleControllerOnly, "the controller may expire holdings but never acquire a lock"))
	}
	if h.User != a.Username {
		errs = append(errs, deny(acq.path.Child("user"), RuleIdentity, "%s.user must be the requesting user %q, not %q", what, a.Username, h.User))
	}
	if oldObj.DeletionTimestamp != nil {
		errs = append(errs, deny(acq.path, RuleTerminating, msgTerminating))
	}
	errs = append(errs, validatePodFields(acq.path, what, h.PodName, h.PodUID, a)...)
	if acq.shared != nil {
		errs = append(errs, validateNotMoved(acq, d)...)
	}
	errs = append(errs, validateFreshLease(o, acq)...)
	errs = append(errs, validateFreshRequest(o, acq.path, acq.h.RequestID)...)
	// The head is its requestID and its user: requestIDs are visible in
	// status, so another user could otherwise copy the head's and jump the
	// queue. Modes do not matter: a reader arriving while a writer waits
	// queues behind it.
	if len(o.Waiters) > 0 && (o.Waiters[0].RequestID != h.RequestID || o.Waiters[0].User != h.User) {
		errs = append(errs, deny(acq.path.Child("requestID"), RuleQueueHead, "only the head of the wait queue (requestID %s of %q) may acquire; request %s of %q is not", o.Waiters[0].RequestID, o.Waiters[0].User, h.RequestID, h.User))
	}
	// A head that stayed at the head could take holding after holding (every
	// permit, every reader slot) while everyone behind it waits.
	if n.WaiterIndex(h.RequestID) >= 0 {
		errs = append(errs, deny(waitersPath, RuleQueueHead, msgAcquirerQueued))
	}
	want, err := locksv1alpha1.NextFencingToken(oldObj.ResourceVersion)
	switch {
	case err != nil:
		errs = append(errs, field.InternalError(tokenPath, err))
	case n.FencingToken != want:
		errs = append(errs, deny(tokenPath, RuleFencingToken, "an acquisition's fencingToken must be the lock's resourceVersion + 1 = %d, not %d", want, n.FencingToken))
	case acq.shared != nil && acq.shared.FencingToken != want:
		errs = append(errs, deny(acq.path.Child("fencingToken"), RuleFencingToken, "a new shared holding's fencingToken must be the lock's resourceVersion + 1 = %d, not %d", want, acq.shared.FencingToken))
	}
	return errs
}

// what names the acquisition's entry in messages.
func (a acquisition) what() string {
	if a.shared == nil {
		return "holder"
	}
	return "sharedHolder"
}

// validateNotMoved refuses a shared holding that leaves its slot for
// another in one write (it would look like an end and a new acquisition).
func validateNotMoved(acq acquisition, d holdings) field.ErrorList {
	for _, e := range d.ended {
		if e.slot != nil && e.h.LeaseID == acq.h.LeaseID {
			return field.ErrorList{deny(acq.path.Child("slot"), RuleSlot, "%s: lease %s cannot move from slot %d to slot %d", msgSharedKept, e.h.LeaseID, *e.slot, acq.shared.Slot)}
		}
	}
	return nil
}

// validateFreshLease refuses an acquisition that reuses a leaseID status still
// remembers, so no client can mistake another's holding for its own.
func validateFreshLease(o *locksv1alpha1.DistributedLockStatus, acq acquisition) field.ErrorList {
	id := acq.h.LeaseID
	used := holds(o, func(h *locksv1alpha1.LockHolder) bool { return h.LeaseID == id })
	for _, r := range o.RecentAcquisitions {
		used = used || r.LeaseID == id
	}
	if used {
		return field.ErrorList{deny(acq.path.Child("leaseID"), RuleLeaseID, msgLeaseID)}
	}
	return nil
}

// holds reports whether any current holding of s, exclusive or shared, matches.
func holds(s *locksv1alpha1.DistributedLockStatus, match func(*locksv1alpha1.LockHolder) bool) bool {
	for _, h := range s.Holdings() {
		if match(h.LockHolder) {
			return true
		}
	}
	return false
}
