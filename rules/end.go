package rules

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/validation/field"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// msgTooManyEnds: every holding a write ends is recorded in that write;
// config/policy gives the same words.
const msgTooManyEnds = "one write may end at most 8 holdings: each is recorded in recentAcquisitions, which keeps 8"

// validateEnds checks the records of a write. A write that ends holdings (a
// release, an expiry, a session's end or a force-release, of one or more)
// records each in recentAcquisitions, matched by slot (none for the
// exclusive holder), with an endReason its writer may give; any other write
// leaves the history as it is.
func validateEnds(oldObj, newObj *locksv1alpha1.DistributedLock, ended []ending, a Actor) field.ErrorList {
	o, n := &oldObj.Status, &newObj.Status
	k := len(ended)
	switch {
	case k == 0 && !equality.Semantic.DeepEqual(o.RecentAcquisitions, n.RecentAcquisitions):
		return field.ErrorList{deny(recentPath, RuleHistory, "recentAcquisitions changes only when a holding ends, by appending its record")}
	case k == 0:
		return nil
	case k > locksv1alpha1.MaxRecentAcquisitions:
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
	canForce, err := mayForceRelease(oldObj, appended, a)
	if err != nil {
		return append(errs, err)
	}
	for _, e := range ended {
		i := recordOf(appended, e)
		if i < 0 {
			errs = append(errs, deny(recentPath, RuleEndRecord, "%s", describe(e)))
			continue
		}
		errs = append(errs, validateEndReason(oldObj, e, appended[i], recentPath.Index(kept+i), a, canForce)...)
	}
	return errs
}

// mayForceRelease asks, once and only when a record says ForceReleased,
// whether a has the force-release verb on the lock.
func mayForceRelease(l *locksv1alpha1.DistributedLock, records []locksv1alpha1.FinishedHolding, a Actor) (bool, *field.Error) {
	if !slices.ContainsFunc(records, func(r locksv1alpha1.FinishedHolding) bool { return r.EndReason == locksv1alpha1.EndReasonForceReleased }) {
		return false, nil
	}
	return a.may(forceRelease(LocksResource, l.Namespace, l.Name), recentPath)
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

// key matches an ending with its record: the slot, -1 for the exclusive holder.
func (e ending) key() int32 { return slotKey(e.slot) }

func slotKey(s *int32) int32 {
	if s == nil {
		return -1
	}
	return *s
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

// validateEndReason checks that a may end e as its record r says: a release
// is its holder's (renew.go), an expiry or a session's end the controller's,
// a force-release needs the verb (canForce).
func validateEndReason(oldObj *locksv1alpha1.DistributedLock, e ending, r locksv1alpha1.FinishedHolding, p *field.Path, a Actor, canForce bool) field.ErrorList {
	switch r.EndReason {
	case locksv1alpha1.EndReasonReleased:
		return validateRelease(e, p, a)
	case locksv1alpha1.EndReasonExpired:
		if !a.IsController {
			return field.ErrorList{deny(p, RuleControllerOnly, "only the kubelock controller may expire a lease; %q is not the controller", a.Username)}
		}
	case locksv1alpha1.EndReasonSessionExpired, locksv1alpha1.EndReasonSessionClosed:
		if !a.IsController {
			return field.ErrorList{deny(p, RuleControllerOnly, "only the kubelock controller may end a holding for its session; %q is not the controller", a.Username)}
		}
	case locksv1alpha1.EndReasonForceReleased:
		if !canForce {
			return field.ErrorList{deny(p, RuleForceRelease, "user %q may not force-release: it needs the %q verb on distributedlocks.locks.kubelock.io in namespace %s", a.Username, locksv1alpha1.ForceReleaseVerb, oldObj.Namespace)}
		}
	default:
		return field.ErrorList{deny(p.Child("endReason"), RuleEndRecord, "endReason %q is not one of Released, Expired, ForceReleased, SessionExpired, SessionClosed", r.EndReason)}
	}
	return nil
}
