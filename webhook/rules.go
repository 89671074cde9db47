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
	// Shared modes (holdings.go): a holding's mode fits the lock's type; a
	// shared holding's slot is free, in range, and never changes.
	RuleMode Rule = "mode"
	RuleSlot Rule = "slot"
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
// the writer may force-release (the SubjectAccessReview is not free): the
// write ends holdings and records one of them as ForceReleased.
func NeedsForceCheck(oldObj, newObj *locksv1alpha1.DistributedLock) bool {
	k := len(diffHoldings(&oldObj.Status, &newObj.Status).ended)
	r := newObj.Status.RecentAcquisitions
	if k == 0 || k > len(r) {
		return false
	}
	for _, f := range r[len(r)-k:] {
		if f.EndReason == locksv1alpha1.EndReasonForceReleased {
			return true
		}
	}
	return false
}

// ValidateStatusUpdate checks one write of the status subresource, oldObj → newObj, by a.
// It is pure: everything it needs is in its arguments.
func ValidateStatusUpdate(oldObj, newObj *locksv1alpha1.DistributedLock, a Actor) field.ErrorList {
	o, n := &oldObj.Status, &newObj.Status
	d := diffHoldings(o, n)
	errs := validateModes(newObj, d, o)
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
	if o.Holder != nil && n.Holder != nil {
		errs = append(errs, validateHeld(o.Holder, n.Holder, a)...)
	}
	for _, k := range d.kept {
		errs = append(errs, validateHeldShared(k, a)...)
	}
	switch {
	case len(d.ended) > 0:
		errs = append(errs, validateEnds(oldObj, newObj, d.ended, a)...)
	case !equality.Semantic.DeepEqual(o.RecentAcquisitions, n.RecentAcquisitions):
		errs = append(errs, deny(recentPath, RuleHistory, "recentAcquisitions changes only when a holding ends, by appending its record"))
	}
	errs = append(errs, validateQueue(o, n, d.acquirers(), a)...)
	errs = append(errs, validateJoin(oldObj, newObj, a)...)
	errs = append(errs, validateBookkeeping(oldObj, newObj, d, a)...)
	return append(errs, validateTimes(n)...)
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
func validateQueue(o, n *locksv1alpha1.DistributedLockStatus, acquirers map[string]bool, a Actor) field.ErrorList {
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
	var removedByOthers []string
	otherPod := false
	for _, w := range o.Waiters {
		if newIDs[w.RequestID] || a.IsController {
			continue
		}
		if w.User == a.Username || acquirers[w.RequestID] {
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
	h := firstHolding(lock)
	if h == nil || lock.Annotations[locksv1alpha1.ForceDeleteAnnotation] == "true" || a.CanForceRelease {
		return nil
	}
	return field.ErrorList{deny(holderPath, RuleHeldDelete, "lock %s is held by %s (lease %s); release it first, or annotate it %s=true, or use an account with the %q verb", lock.Name, h.User, h.LeaseID, locksv1alpha1.ForceDeleteAnnotation, locksv1alpha1.ForceReleaseVerb)}
}

// firstHolding is the holding delete denials name: the exclusive holder, else
// the first shared holder; nil when the lock is free.
func firstHolding(lock *locksv1alpha1.DistributedLock) *locksv1alpha1.LockHolder {
	switch s := &lock.Status; {
	case s.Holder != nil:
		return s.Holder
	case len(s.SharedHolders) > 0:
		return &s.SharedHolders[0].LockHolder
	}
	return nil
}
