// Package webhook is kubelock's admission: it validates, and never mutates,
// every write to DistributedLocks so that only the holder renews or releases,
// only the queue head acquires, tokens are the server's and nobody writes a
// name other than their own. The same rules exist as a ValidatingAdmissionPolicy
// in config/policy; one hostile-input suite proves the two equal.
package webhook

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/validation/field"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// Rule names an admission rule. Every denial message starts with
// "[kubelock:<rule>]" in both engines, so users and tests can tell which rule failed.
type Rule string

// The rule table: docs/security.md says what each rule guards, docs/design.md
// "Transitions" when it applies.
const (
	RuleIdentity       Rule = "identity"
	RulePodBinding     Rule = "pod-binding"
	RuleHolderOnly     Rule = "holder-only"
	RuleHolderFields   Rule = "holder-fields"
	RuleQueueHead      Rule = "queue-head"
	RuleFencingToken   Rule = "fencing-token"
	RuleEndRecord      Rule = "end-record"
	RuleControllerOnly Rule = "controller-only"
	RuleForceRelease   Rule = "force-release"
	RuleQueue          Rule = "queue"
	RuleHistory        Rule = "history"
	RuleHeldDelete     Rule = "held-delete"
	RuleBookkeeping    Rule = "bookkeeping"
	RuleTimeFormat     Rule = "time-format"
	RuleWaitBound      Rule = "wait-bound"
	RuleLeaseID        Rule = "lease-id"
	RuleTerminating    Rule = "terminating"
	// The main resource's (metadata.go); RuleHeldDelete covers finalizers too.
	RuleForceDelete Rule = "force-delete"
	RuleCreate      Rule = "create"
	// Fenced objects' (fenced.go).
	RuleStaleToken   Rule = "stale-token"
	RuleFencedWriter Rule = "fenced-writer"
	RuleFencedBy     Rule = "fenced-by"
	// LockSessions' and the session fields of locks (session.go).
	RuleSession Rule = "session"
)

// Extra keys a bound service-account token carries.
const (
	ExtraPodName = locksv1alpha1.PodNameExtra
	ExtraPodUID  = locksv1alpha1.PodUIDExtra
)

// Actor is who writes, as admission sees it: request.userInfo's username
// and extra, and whether it is the controller's service account.
type Actor struct {
	Username     string
	Extra        map[string][]string
	IsController bool
	// CanForceRelease is the answer of a SubjectAccessReview for force-release;
	// callers compute it only when NeedsForceCheck says so.
	CanForceRelease bool
}

// deny builds an error whose message starts with the rule's tag; the rule
// itself travels as the error's Origin (ruleOf), never parsed from the message.
func deny(p *field.Path, r Rule, format string, args ...any) *field.Error {
	return field.Forbidden(p, fmt.Sprintf("[kubelock:%s] ", r)+fmt.Sprintf(format, args...)).WithOrigin(string(r))
}

// ruleOf is the rule of an error built by deny; "internal" otherwise.
func ruleOf(e *field.Error) Rule {
	if e.Origin == "" {
		return "internal"
	}
	return Rule(e.Origin)
}

var (
	statusPath  = field.NewPath("status")
	holderPath  = statusPath.Child("holder")
	tokenPath   = statusPath.Child("fencingToken")
	waitersPath = statusPath.Child("waiters")
	recentPath  = statusPath.Child("recentAcquisitions")
)

// NeedsForceCheck reports whether validating oldObj → newObj needs to know whether
// the writer may force-release (the SubjectAccessReview is not free).
func NeedsForceCheck(oldObj, newObj *locksv1alpha1.DistributedLock) bool {
	if oldObj.Status.Holder == nil || newObj.Status.Holder != nil {
		return false
	}
	r := newObj.Status.RecentAcquisitions
	return len(r) > 0 && r[len(r)-1].EndReason == locksv1alpha1.EndReasonForceReleased
}

// ValidateStatusUpdate checks one write of the status subresource, oldObj → newObj, by a.
// It is pure: everything it needs is in its arguments.
func ValidateStatusUpdate(oldObj, newObj *locksv1alpha1.DistributedLock, a Actor) field.ErrorList {
	var errs field.ErrorList
	o, n := &oldObj.Status, &newObj.Status
	switch {
	case o.Holder == nil && n.Holder != nil:
		errs = append(errs, validateAcquire(oldObj, newObj, a)...)
	case o.Holder != nil && n.Holder == nil:
		errs = append(errs, validateEnd(oldObj, newObj, a)...)
	case o.Holder != nil:
		errs = append(errs, validateHeld(o.Holder, n.Holder, a)...)
	}
	if !(o.Holder == nil && n.Holder != nil) && n.FencingToken != o.FencingToken {
		errs = append(errs, deny(tokenPath, RuleFencingToken, "fencingToken changes only when a lock is acquired; it is %d", o.FencingToken))
	}
	if !(o.Holder != nil && n.Holder == nil) && !equality.Semantic.DeepEqual(o.RecentAcquisitions, n.RecentAcquisitions) {
		errs = append(errs, deny(recentPath, RuleHistory, "recentAcquisitions changes only when a holding ends, by appending its record"))
	}
	errs = append(errs, validateQueue(o, n, a)...)
	errs = append(errs, validateJoin(oldObj, newObj, a)...)
	errs = append(errs, validateBookkeeping(oldObj, newObj, a)...)
	return append(errs, validateTimes(n)...)
}

func validateAcquire(oldObj, newObj *locksv1alpha1.DistributedLock, a Actor) field.ErrorList {
	var errs field.ErrorList
	o, n := &oldObj.Status, &newObj.Status
	h := n.Holder
	if a.IsController {
		errs = append(errs, deny(holderPath, RuleControllerOnly, "the controller may expire holdings but never acquire a lock"))
	}
	if h.User != a.Username {
		errs = append(errs, deny(holderPath.Child("user"), RuleIdentity, "holder.user must be the requesting user %q, not %q", a.Username, h.User))
	}
	if oldObj.DeletionTimestamp != nil {
		errs = append(errs, deny(holderPath, RuleTerminating, msgTerminating))
	}
	podName, podUID := a.pod()
	errs = append(errs, validatePodFields(holderPath, "holder", h.PodName, h.PodUID, a, podName, podUID)...)
	errs = append(errs, validateFreshLease(o, h)...)
	// The head is its requestID and its user: requestIDs are visible in
	// status, so another user could otherwise copy the head's and jump the queue.
	if len(o.Waiters) > 0 && (o.Waiters[0].RequestID != h.RequestID || o.Waiters[0].User != h.User) {
		errs = append(errs, deny(holderPath.Child("requestID"), RuleQueueHead, "only the head of the wait queue (requestID %s of %q) may acquire; request %s of %q is not", o.Waiters[0].RequestID, o.Waiters[0].User, h.RequestID, h.User))
	}
	want, err := locksv1alpha1.NextFencingToken(oldObj.ResourceVersion)
	switch {
	case err != nil:
		errs = append(errs, field.InternalError(tokenPath, err))
	case n.FencingToken != want:
		errs = append(errs, deny(tokenPath, RuleFencingToken, "an acquisition's fencingToken must be the lock's resourceVersion + 1 = %d, not %d", want, n.FencingToken))
	}
	return errs
}

// validateEnd checks a release, an expiry or a force-release.
func validateEnd(oldObj, newObj *locksv1alpha1.DistributedLock, a Actor) field.ErrorList {
	o, n := &oldObj.Status, &newObj.Status
	h := o.Holder
	want := append(append([]locksv1alpha1.FinishedHolding(nil), o.RecentAcquisitions...), locksv1alpha1.FinishedHolding{})
	if len(want) > locksv1alpha1.MaxRecentAcquisitions {
		want = want[len(want)-locksv1alpha1.MaxRecentAcquisitions:]
	}
	if len(n.RecentAcquisitions) != len(want) {
		return field.ErrorList{deny(recentPath, RuleEndRecord, "ending the holding of lease %s must append exactly its record to recentAcquisitions (oldest dropped beyond %d)", h.LeaseID, locksv1alpha1.MaxRecentAcquisitions)}
	}
	last := n.RecentAcquisitions[len(want)-1]
	if !equality.Semantic.DeepEqual(n.RecentAcquisitions[:len(want)-1], want[:len(want)-1]) {
		return field.ErrorList{deny(recentPath, RuleEndRecord, "ending a holding must keep the earlier records of recentAcquisitions unchanged")}
	}
	var errs field.ErrorList
	p := recentPath.Index(len(want) - 1)
	if last.LeaseID != h.LeaseID || last.RequestID != h.RequestID || last.FencingToken != o.FencingToken || last.Identity != h.Identity {
		errs = append(errs, deny(p, RuleEndRecord, "the record must describe the ending holding: leaseID %s, requestID %s, fencingToken %d, identity %s", h.LeaseID, h.RequestID, o.FencingToken, h.Identity))
	}
	if last.EndedBy != a.Username {
		errs = append(errs, deny(p.Child("endedBy"), RuleIdentity, "endedBy must be the requesting user %q, not %q", a.Username, last.EndedBy))
	}
	switch last.EndReason {
	case locksv1alpha1.EndReasonReleased:
		if a.Username != h.User {
			errs = append(errs, deny(holderPath, RuleHolderOnly, "only the holder %q may release lease %s; %q is not the holder (a user with the force-release verb may force-release)", h.User, h.LeaseID, a.Username))
		}
		if !samePod(h.PodUID, a) {
			errs = append(errs, deny(holderPath, RulePodBinding, msgPodHolding))
		}
	case locksv1alpha1.EndReasonExpired:
		if !a.IsController {
			errs = append(errs, deny(holderPath, RuleControllerOnly, "only the kubelock controller may expire a lease; %q is not the controller", a.Username))
		}
	case locksv1alpha1.EndReasonSessionExpired, locksv1alpha1.EndReasonSessionClosed:
		if !a.IsController {
			errs = append(errs, deny(holderPath, RuleControllerOnly, "only the kubelock controller may end a holding for its session; %q is not the controller", a.Username))
		}
	case locksv1alpha1.EndReasonForceReleased:
		if !a.CanForceRelease {
			errs = append(errs, deny(holderPath, RuleForceRelease, "user %q may not force-release: it needs the %q verb on distributedlocks.locks.kubelock.io in namespace %s", a.Username, locksv1alpha1.ForceReleaseVerb, oldObj.Namespace))
		}
	default:
		errs = append(errs, deny(p.Child("endReason"), RuleEndRecord, "endReason %q is not one of Released, Expired, ForceReleased, SessionExpired, SessionClosed", last.EndReason))
	}
	return errs
}

// validateHeld checks a write that keeps the same holding.
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

// validateQueue checks that the queue only lost entries their owners (or the
// controller, or an acquisition) removed, and only gained entries at the tail,
// each written by its own user.
func validateQueue(o, n *locksv1alpha1.DistributedLockStatus, a Actor) field.ErrorList {
	var errs field.ErrorList
	oldIdx := make(map[string]int, len(o.Waiters))
	for i, w := range o.Waiters {
		oldIdx[w.RequestID] = i
	}
	newIDs := make(map[string]bool, len(n.Waiters))
	prev, added := -1, false
	for i, w := range n.Waiters {
		newIDs[w.RequestID] = true
		p := waitersPath.Index(i)
		j, kept := oldIdx[w.RequestID]
		switch {
		case !kept:
			added = true
			if a.IsController {
				errs = append(errs, deny(p, RuleControllerOnly, "the controller may drop waiters but never enqueue"))
			}
			if w.User != a.Username {
				errs = append(errs, deny(p.Child("user"), RuleIdentity, "a waiter's user must be the requesting user %q, not %q", a.Username, w.User))
			}
		case added || j < prev:
			errs = append(errs, deny(p, RuleQueue, "waiters join only at the tail and keep their order; %s moved", w.RequestID))
		case !equality.Semantic.DeepEqual(w, o.Waiters[j]):
			errs = append(errs, deny(p, RuleQueue, "queue entry %s cannot change; leave the queue and join again", w.RequestID))
		default:
			prev = j
		}
	}
	acquirer := ""
	if o.Holder == nil && n.Holder != nil {
		acquirer = n.Holder.RequestID
	}
	var removedByOthers []string
	otherPod := false
	for _, w := range o.Waiters {
		if newIDs[w.RequestID] || a.IsController {
			continue
		}
		if w.User == a.Username || w.RequestID == acquirer {
			// Its own user (or acquisition) removes it, but a pod's entry
			// only from that pod: another pod of one account is another waiter.
			otherPod = otherPod || (w.User == a.Username && !samePod(w.PodUID, a))
			continue
		}
		removedByOthers = append(removedByOthers, fmt.Sprintf("%s (user %s)", w.RequestID, w.User))
	}
	if len(removedByOthers) > 0 {
		errs = append(errs, deny(waitersPath, RuleQueue, "%q may remove only its own queue entries, not %s", a.Username, strings.Join(removedByOthers, ", ")))
	}
	if otherPod {
		errs = append(errs, deny(waitersPath, RulePodBinding, msgPodWaiter))
	}
	return errs
}

// ValidateDelete checks deleting lock: a held lock goes only with the
// force-delete annotation or the force-release verb, so no holder's state is
// silently lost.
func ValidateDelete(lock *locksv1alpha1.DistributedLock, a Actor) field.ErrorList {
	h := lock.Status.Holder
	if h == nil || lock.Annotations[locksv1alpha1.ForceDeleteAnnotation] == "true" || a.CanForceRelease {
		return nil
	}
	return field.ErrorList{deny(holderPath, RuleHeldDelete, "lock %s is held by %s (lease %s); release it first, or annotate it %s=true, or use an account with the %q verb", lock.Name, h.User, h.LeaseID, locksv1alpha1.ForceDeleteAnnotation, locksv1alpha1.ForceReleaseVerb)}
}
