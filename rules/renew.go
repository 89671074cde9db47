package rules

import (
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/validation/field"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// Fixed messages of the renew and release rules; config/policy gives the
// same words.
const (
	msgSharedKept = "a shared holding's slot and fencingToken never change while it lasts"
	msgPodHolding = "a holding bound to a pod is renewed or released only by its user from that same pod (holder.podUID)"
)

// validateKept checks the holdings a write keeps: only their owner renews
// them, and nothing but renewTime changes while they last.
func validateKept(o, n *locksv1alpha1.DistributedLockStatus, d holdings, a Actor) field.ErrorList {
	var errs field.ErrorList
	if o.Holder != nil && n.Holder != nil {
		errs = validateHeld(o.Holder, n.Holder, a)
	}
	for _, k := range d.kept {
		errs = append(errs, validateHeldShared(k, a)...)
	}
	return errs
}

// validateHeld checks a write that keeps the same exclusive holding.
func validateHeld(o, n *locksv1alpha1.LockHolder, a Actor) field.ErrorList {
	var errs field.ErrorList
	if o.LeaseID != n.LeaseID {
		return field.ErrorList{deny(holderPath.Child("leaseID"), RuleHolderOnly, "a held lock cannot pass to another leaseID (%s → %s); it must be released first", o.LeaseID, n.LeaseID)}
	}
	renewed := !equality.Semantic.DeepEqual(o.RenewTime, n.RenewTime)
	if renewed && a.Username != o.User {
		errs = append(errs, deny(holderPath.Child("renewTime"), RuleHolderOnly, "only the holder %q may renew lease %s; %q is not the holder", o.User, o.LeaseID, a.Username))
	}
	if renewed && !samePod(o.PodUID, a) {
		errs = append(errs, deny(holderPath, RulePodBinding, msgPodHolding))
	}
	rest, nrest := *o, *n
	rest.RenewTime, nrest.RenewTime = nil, nil
	if !equality.Semantic.DeepEqual(rest, nrest) {
		errs = append(errs, deny(holderPath, RuleHolderFields, "while lease %s is held only holder.renewTime may change", o.LeaseID))
	}
	return errs
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

// validateRelease checks that a may release e, whose record is at p: its
// holder, from its pod when the holding has one.
func validateRelease(e ending, p *field.Path, a Actor) field.ErrorList {
	var errs field.ErrorList
	if a.Username != e.h.User {
		errs = append(errs, deny(p, RuleHolderOnly, "only the holder %q may release lease %s; %q is not the holder (a user with the force-release verb may force-release)", e.h.User, e.h.LeaseID, a.Username))
	}
	if !samePod(e.h.PodUID, a) {
		errs = append(errs, deny(p, RulePodBinding, msgPodHolding))
	}
	return errs
}
