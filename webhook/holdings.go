package webhook

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/validation/field"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// Fixed messages of the shared-mode rules (issue 16); config/policy gives the
// same words.
const (
	msgOneAcquisition  = "one write may acquire at most one holding: the exclusive holder or one shared holder"
	msgBothModes       = "a lock is held exclusively or shared, never both: status.holder and status.sharedHolders cannot be set together"
	msgMutexShared     = "a Mutex is held only Exclusive: it has no shared holders"
	msgSemaphoreHolder = "a Semaphore is held only Shared: its permits are status.sharedHolders, never status.holder"
	msgWaiterMode      = "a waiter's mode must be one the lock's type supports: a Mutex's waiters are Exclusive, a Semaphore's Shared"
	msgSharedKept      = "a shared holding's slot and fencingToken never change while it lasts"
	msgTooManyEnds     = "one write may end at most 8 holdings: each is recorded in recentAcquisitions, which keeps 8"
	msgHolderCount     = "status.holderCount must equal the number of holdings, exclusive and shared"
	msgTransitions     = "status.transitions must grow by exactly one on each acquisition and stay unchanged otherwise"
	msgAcquirerQueued  = "an acquisition takes its own entry out of the wait queue in the same write: its requestID may not stay in status.waiters (or join it)"
)

var sharedPath = statusPath.Child("sharedHolders")

// holdings is what one status write does to a lock's holdings. Shared
// entries are matched by slot, the key of the CRD's list map (the apiserver
// has already refused two entries on one slot): a slot present before and
// after is kept, and validateHeldShared refuses it unless it is the same
// holding (leaseID, user, identity, requestID, session, token), renewed at most.
type holdings struct {
	// acquired are the holdings the write adds: a new exclusive holder, and
	// shared entries on slots the old status did not use.
	acquired []acquisition
	// ended are the holdings the write removes.
	ended []ending
	// kept are the shared entries present before and after.
	kept []keptShared
}

type acquisition struct {
	h *locksv1alpha1.LockHolder
	// shared is the entry for a shared holding; nil for the exclusive holder.
	shared *locksv1alpha1.SharedHolder
	path   *field.Path
}

// what names the acquisition's entry in messages.
func (a acquisition) what() string {
	if a.shared == nil {
		return "holder"
	}
	return "sharedHolder"
}

type ending struct {
	h     locksv1alpha1.LockHolder
	token int64
	// slot is the shared entry's; nil for the exclusive holder.
	slot *int32
}

// key matches an ending with its record: the slot, -1 for the exclusive holder.
func (e ending) key() int32 { return slotKey(e.slot) }

func slotKey(s *int32) int32 {
	if s == nil {
		return -1
	}
	return *s
}

type keptShared struct {
	old, new *locksv1alpha1.SharedHolder
	path     *field.Path
}

func diffHoldings(o, n *locksv1alpha1.DistributedLockStatus) holdings {
	var d holdings
	if o.Holder == nil && n.Holder != nil {
		d.acquired = append(d.acquired, acquisition{h: n.Holder, path: holderPath})
	}
	if o.Holder != nil && n.Holder == nil {
		d.ended = append(d.ended, ending{h: *o.Holder, token: o.FencingToken})
	}
	oldAt := make(map[int32]int, len(o.SharedHolders))
	for i := range o.SharedHolders {
		oldAt[o.SharedHolders[i].Slot] = i
	}
	newAt := make(map[int32]bool, len(n.SharedHolders))
	for i := range n.SharedHolders {
		e, p := &n.SharedHolders[i], sharedPath.Index(i)
		newAt[e.Slot] = true
		if j, ok := oldAt[e.Slot]; ok {
			d.kept = append(d.kept, keptShared{old: &o.SharedHolders[j], new: e, path: p})
		} else {
			d.acquired = append(d.acquired, acquisition{h: &e.LockHolder, shared: e, path: p})
		}
	}
	for i := range o.SharedHolders {
		if e := o.SharedHolders[i]; !newAt[e.Slot] {
			d.ended = append(d.ended, ending{h: e.LockHolder, token: e.FencingToken, slot: &e.Slot})
		}
	}
	return d
}

// requestIDs of the acquisitions, whose own queue entries may leave with them.
func (d holdings) acquirers() map[string]bool {
	ids := make(map[string]bool, len(d.acquired))
	for _, a := range d.acquired {
		ids[a.h.RequestID] = true
	}
	return ids
}

// validateModes checks that the holdings fit the lock's type (rule mode) and
// that shared entries sit on distinct slots in range (rule slot). The CRD
// keeps the same invariants; they are here too so that the pure rules (and
// their fuzzing) stand on their own.
func validateModes(l *locksv1alpha1.DistributedLock, d holdings, o *locksv1alpha1.DistributedLockStatus) field.ErrorList {
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
	for _, i := range addedWaiters(o, n) {
		if w := n.Waiters[i]; !l.Supports(waiterMode(w)) {
			errs = append(errs, deny(waitersPath.Index(i).Child("mode"), RuleMode, msgWaiterMode))
		}
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

// waiterMode is w's mode with the CRD's default applied.
func waiterMode(w locksv1alpha1.Waiter) locksv1alpha1.Mode {
	if w.Mode == "" {
		return locksv1alpha1.Exclusive
	}
	return w.Mode
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
	// permit, every reader slot) while everyone behind it waits (red team).
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
// remembers, so no client can mistake another's holding for its own (class 8).
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

// validateHeldShared checks a shared entry the write keeps: only its owner
// renews it, and nothing but renewTime changes.
func validateHeldShared(k keptShared, a Actor) field.ErrorList {
	o, n := k.old, k.new
	if o.LeaseID != n.LeaseID {
		return field.ErrorList{deny(k.path.Child("leaseID"), RuleHolderOnly, "a shared holding cannot pass to another leaseID (%s → %s); it must be released first", o.LeaseID, n.LeaseID)}
	}
	var errs field.ErrorList
	if o.FencingToken != n.FencingToken || o.Slot != n.Slot {
		errs = append(errs, deny(k.path.Child("fencingToken"), RuleSlot, msgSharedKept))
	}
	renewed := !equality.Semantic.DeepEqual(o.RenewTime, n.RenewTime)
	if renewed && a.Username != o.User {
		errs = append(errs, deny(k.path.Child("renewTime"), RuleHolderOnly, "only the holder %q may renew lease %s; %q is not the holder", o.User, o.LeaseID, a.Username))
	}
	if renewed && !samePod(o.PodUID, a) {
		errs = append(errs, deny(k.path, RulePodBinding, msgPodHolding))
	}
	rest, nrest := o.LockHolder, n.LockHolder
	rest.RenewTime, nrest.RenewTime = nil, nil
	if !equality.Semantic.DeepEqual(rest, nrest) {
		errs = append(errs, deny(k.path, RuleHolderFields, "while lease %s is held only its renewTime may change", o.LeaseID))
	}
	return errs
}

// validateEnds checks a write that ends holdings: a release, an expiry, a
// session's end or a force-release, of one or more holdings. Each is
// recorded in recentAcquisitions by the same write, matched by slot (none for
// the exclusive holder), and each record's endReason is one its writer may give.
func validateEnds(oldObj, newObj *locksv1alpha1.DistributedLock, ended []ending, a Actor) field.ErrorList {
	o, n := &oldObj.Status, &newObj.Status
	k := len(ended)
	if k > locksv1alpha1.MaxRecentAcquisitions {
		return field.ErrorList{deny(recentPath, RuleEndRecord, msgTooManyEnds)}
	}
	wantLen := min(len(o.RecentAcquisitions)+k, locksv1alpha1.MaxRecentAcquisitions)
	if len(n.RecentAcquisitions) != wantLen {
		return field.ErrorList{deny(recentPath, RuleEndRecord, "%s", appendExactly(ended))}
	}
	kept := wantLen - k
	if !equality.Semantic.DeepEqual(n.RecentAcquisitions[:kept], o.RecentAcquisitions[len(o.RecentAcquisitions)-kept:]) {
		return field.ErrorList{deny(recentPath, RuleEndRecord, "ending a holding must keep the earlier records of recentAcquisitions unchanged")}
	}
	appended := n.RecentAcquisitions[kept:]
	var errs field.ErrorList
	for i, r := range appended {
		if r.EndedBy != a.Username {
			errs = append(errs, deny(recentPath.Index(kept+i).Child("endedBy"), RuleIdentity, "endedBy must be the requesting user %q, not %q", a.Username, r.EndedBy))
		}
	}
	for _, e := range ended {
		i := recordOf(appended, e)
		if i < 0 {
			errs = append(errs, deny(recentPath, RuleEndRecord, "%s", describe(e)))
			continue
		}
		errs = append(errs, validateEndReason(oldObj, e, appended[i], recentPath.Index(kept+i), a)...)
	}
	return errs
}

// recordOf is the index in records of e's record: the one on e's slot that
// describes e, or -1.
func recordOf(records []locksv1alpha1.FinishedHolding, e ending) int {
	for i, r := range records {
		if slotKey(r.Slot) == e.key() && r.LeaseID == e.h.LeaseID && r.RequestID == e.h.RequestID &&
			r.FencingToken == e.token && r.Identity == e.h.Identity {
			return i
		}
	}
	return -1
}

func appendExactly(ended []ending) string {
	if len(ended) == 1 {
		return fmt.Sprintf("ending the holding of lease %s must append exactly its record to recentAcquisitions (oldest dropped beyond %d)", ended[0].h.LeaseID, locksv1alpha1.MaxRecentAcquisitions)
	}
	ids := make([]string, len(ended))
	for i, e := range ended {
		ids[i] = e.h.LeaseID
	}
	return fmt.Sprintf("ending the holdings of leases %s must append exactly their records to recentAcquisitions (oldest dropped beyond %d)", strings.Join(ids, ", "), locksv1alpha1.MaxRecentAcquisitions)
}

func describe(e ending) string {
	s := fmt.Sprintf("the record must describe the ending holding: leaseID %s, requestID %s, fencingToken %d, identity %s", e.h.LeaseID, e.h.RequestID, e.token, e.h.Identity)
	if e.slot != nil {
		s += fmt.Sprintf(", slot %d", *e.slot)
	}
	return s
}

// validateEndReason checks that a may end e as its record r says.
func validateEndReason(oldObj *locksv1alpha1.DistributedLock, e ending, r locksv1alpha1.FinishedHolding, p *field.Path, a Actor) field.ErrorList {
	var errs field.ErrorList
	switch r.EndReason {
	case locksv1alpha1.EndReasonReleased:
		if a.Username != e.h.User {
			errs = append(errs, deny(p, RuleHolderOnly, "only the holder %q may release lease %s; %q is not the holder (a user with the force-release verb may force-release)", e.h.User, e.h.LeaseID, a.Username))
		}
		if !samePod(e.h.PodUID, a) {
			errs = append(errs, deny(p, RulePodBinding, msgPodHolding))
		}
	case locksv1alpha1.EndReasonExpired:
		if !a.IsController {
			errs = append(errs, deny(p, RuleControllerOnly, "only the kubelock controller may expire a lease; %q is not the controller", a.Username))
		}
	case locksv1alpha1.EndReasonSessionExpired, locksv1alpha1.EndReasonSessionClosed:
		if !a.IsController {
			errs = append(errs, deny(p, RuleControllerOnly, "only the kubelock controller may end a holding for its session; %q is not the controller", a.Username))
		}
	case locksv1alpha1.EndReasonForceReleased:
		if !a.CanForceRelease {
			errs = append(errs, deny(p, RuleForceRelease, "user %q may not force-release: it needs the %q verb on distributedlocks.locks.kubelock.io in namespace %s", a.Username, locksv1alpha1.ForceReleaseVerb, oldObj.Namespace))
		}
	default:
		errs = append(errs, deny(p.Child("endReason"), RuleEndRecord, "endReason %q is not one of Released, Expired, ForceReleased, SessionExpired, SessionClosed", r.EndReason))
	}
	return errs
}

// holderCount is the number of holdings in s, exclusive and shared.
func holderCount(s *locksv1alpha1.DistributedLockStatus) int32 {
	n := int32(len(s.SharedHolders))
	if s.Holder != nil {
		n++
	}
	return n
}
