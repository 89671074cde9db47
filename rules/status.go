package rules

import (
	"k8s.io/apimachinery/pkg/util/validation/field"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// ValidateStatusUpdate checks one write of the status subresource, oldObj →
// newObj, by a: each transition it makes (docs/design.md "Transitions"),
// and what every write keeps true. It is pure but for a's Authorizer, asked
// only when the write force-releases.
func ValidateStatusUpdate(oldObj, newObj *locksv1alpha1.DistributedLock, a Actor) field.ErrorList {
	d := diffHoldings(&oldObj.Status, &newObj.Status)
	errs := validateAcquire(oldObj, newObj, d, a)
	errs = append(errs, validateKept(&oldObj.Status, &newObj.Status, d, a)...)
	errs = append(errs, validateEnds(oldObj, newObj, d.ended, a)...)
	errs = append(errs, validateQueue(oldObj, newObj, d.acquirers(), a)...)
	return append(errs, validateBookkeeping(oldObj, newObj, d, a)...)
}

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

type ending struct {
	h     locksv1alpha1.LockHolder
	token int64
	// slot is the shared entry's; nil for the exclusive holder.
	slot *int32
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
