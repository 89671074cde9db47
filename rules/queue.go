package rules

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/validation/field"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// Fixed messages of the queue rules; config/policy gives the same words.
const (
	msgOneWaiterPerWrite = "one write may add at most one waiter to the queue"
	msgWaitersPerUser    = "a user may have at most min(spec.maxWaitersPerUser, spec.maxWaiters) entries in the wait queue"
	msgWaitersPerPod     = "a pod may have at most one entry in the wait queue"
	msgWaitBound         = "a new waiter's deadline must be after its enqueueTime and at most spec.maxWaitSeconds after it"
	msgWaiterMode        = "a waiter's mode must be one the lock's type supports: a Mutex's waiters are Exclusive, a Semaphore's Shared"
	msgPodWaiter         = "a queue entry bound to a pod leaves the queue only from that same pod (waiters[].podUID) or by the controller"
)

// validateQueue checks what a write does to the wait queue: entries keep
// their order and contents, leave only by their owner (or the controller, or
// their own acquisition: acquirers are the requestIDs of the write's
// acquisitions) and join only at the tail, as validateJoin bounds.
func validateQueue(oldObj, newObj *locksv1alpha1.DistributedLock, acquirers map[string]bool, a Actor) field.ErrorList {
	o, n := &oldObj.Status, &newObj.Status
	errs := validateOrder(o, n, a)
	errs = append(errs, validateLeave(o, n, acquirers, a)...)
	return append(errs, validateJoin(oldObj, newObj, a)...)
}

// validateOrder checks that the entries of n that o had keep their order and
// contents, and that new ones come after them, each written by its own user.
func validateOrder(o, n *locksv1alpha1.DistributedLockStatus, a Actor) field.ErrorList {
	var errs field.ErrorList
	oldIdx := make(map[string]int, len(o.Waiters))
	for i, w := range o.Waiters {
		oldIdx[w.RequestID] = i
	}
	prev, added := -1, false
	for i, w := range n.Waiters {
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
	return errs
}

// validateLeave checks the entries o had and n has not: only their own user
// (from their pod), their acquisition or the controller removes them.
func validateLeave(o, n *locksv1alpha1.DistributedLockStatus, acquirers map[string]bool, a Actor) field.ErrorList {
	if a.IsController {
		return nil
	}
	stays := make(map[string]bool, len(n.Waiters))
	for _, w := range n.Waiters {
		stays[w.RequestID] = true
	}
	var errs field.ErrorList
	var removedByOthers []string
	otherPod := false
	for _, w := range o.Waiters {
		if stays[w.RequestID] {
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

// validateJoin bounds what one write may add to the queue: one entry of a
// mode the lock's type has, within the user's and the pod's share, with a
// bounded wait, carrying the writer's pod, never on a lock being deleted.
func validateJoin(oldObj, newObj *locksv1alpha1.DistributedLock, a Actor) field.ErrorList {
	o, n := &oldObj.Status, &newObj.Status
	added := addedWaiters(o, n)
	if len(added) == 0 {
		return nil
	}
	var errs field.ErrorList
	if oldObj.DeletionTimestamp != nil {
		errs = append(errs, deny(waitersPath, RuleTerminating, msgTerminating))
	}
	if len(added) > 1 {
		errs = append(errs, deny(waitersPath, RuleQueue, msgOneWaiterPerWrite))
	}
	_, podUID := a.pod()
	mine, minePod := 0, 0
	for _, w := range n.Waiters {
		if w.User == a.Username {
			mine++
			if podUID != "" && w.PodUID == podUID {
				minePod++
			}
		}
	}
	if mine > newObj.MaxWaitersPerUser() {
		errs = append(errs, deny(waitersPath, RuleQueue, msgWaitersPerUser))
	}
	if minePod > 1 {
		errs = append(errs, deny(waitersPath, RuleQueue, msgWaitersPerPod))
	}
	for _, i := range added {
		w, p := &n.Waiters[i], waitersPath.Index(i)
		if !newObj.Supports(w.ModeOrDefault()) {
			errs = append(errs, deny(p.Child("mode"), RuleMode, msgWaiterMode))
		}
		if d := w.Deadline.Sub(w.EnqueueTime.Time); d <= 0 || d > newObj.MaxWait() {
			errs = append(errs, deny(p.Child("deadline"), RuleWaitBound, msgWaitBound))
		}
		errs = append(errs, validatePodFields(p, "waiter", w.PodName, w.PodUID, a)...)
		errs = append(errs, validateFreshRequest(o, p, w.RequestID)...)
	}
	return errs
}

// addedWaiters are the entries of n that o does not have, by requestID.
func addedWaiters(o, n *locksv1alpha1.DistributedLockStatus) []int {
	old := make(map[string]bool, len(o.Waiters))
	for _, w := range o.Waiters {
		old[w.RequestID] = true
	}
	var added []int
	for i, w := range n.Waiters {
		if !old[w.RequestID] {
			added = append(added, i)
		}
	}
	return added
}
