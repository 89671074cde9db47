package rules

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// FuzzValidateStatusUpdate feeds random old/new pairs and actors to the pure
// rules and checks, for every accepted write, the properties the rules exist for.
func FuzzValidateStatusUpdate(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("\x01\x00\x02\x01\x03\x00\x00\x01\x00\x01\x00\x00\x00\x01"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s := &bytesource{b: data}
		oldObj := s.lock()
		newObj := oldObj.DeepCopy()
		expectNoAcceptedViolation(t, oldObj, newObj, s.actor(s.mutate(newObj)))
	})
}

// expectNoAcceptedViolation validates oldObj → newObj by a and, if the rules
// accept it, holds it to the oracles.
func expectNoAcceptedViolation(t *testing.T, oldObj, newObj *locksv1alpha1.DistributedLock, a Actor) {
	t.Helper()
	if errs := ValidateStatusUpdate(oldObj, newObj, a); len(errs) > 0 {
		return
	}
	msg := acceptedViolation(oldObj, newObj, a)
	if msg == "" {
		msg = sharedViolation(oldObj, newObj, a)
	}
	if msg != "" {
		t.Fatalf("accepted %s\nactor %+v\nold %s\nnew %s", msg, a, dump(oldObj.Status), dump(newObj.Status))
	}
}

// acceptedViolation is the oracle: what no accepted write may do.
func acceptedViolation(oldObj, newObj *locksv1alpha1.DistributedLock, a Actor) string {
	o, n := &oldObj.Status, &newObj.Status
	// Every time Go writes back must read again, or the lock freezes.
	b, err := json.Marshal(newObj)
	if err != nil {
		return "a status Go cannot marshal: " + err.Error()
	}
	var back locksv1alpha1.DistributedLock
	if err := json.Unmarshal(b, &back); err != nil {
		return "a status Go cannot read back: " + err.Error()
	}
	if errs := ValidateRawStatusTimes(b); len(errs) > 0 {
		return "times the CRD patterns refuse: " + errs.ToAggregate().Error()
	}
	if msg := movedRuleViolation(o, n); msg != "" {
		return msg
	}
	if a.IsController {
		return newHoldingViolation(oldObj, newObj, a)
	}
	_, uid := a.pod()
	if o.Holder != nil && !mayForce(a) && (a.Username != o.Holder.User || (o.Holder.PodUID != "" && uid != o.Holder.PodUID)) {
		if !equality.Semantic.DeepEqual(o.Holder, n.Holder) {
			return "a change of the holder by someone who is not the holder"
		}
		if n.FencingToken != o.FencingToken {
			return "a change of the token by someone who is not the holder"
		}
	}
	if msg := queueViolation(oldObj, newObj, a); msg != "" {
		return msg
	}
	// New holdings (exclusive or shared): one per write, the writer's own,
	// a fresh lease ID, the server's token, by the queue's head.
	return newHoldingViolation(oldObj, newObj, a)
}

// movedRuleViolation holds every writer, the controller and breakers too, to
// the transition rules the CRD left to admission (docs/design.md, "The CRD's
// rules"): a holding keeps everything but renewTime while it lasts, on its
// slot; one that ends is recorded; transitions counts the acquisitions; no
// shared token is above status.fencingToken, which never decreases.
func movedRuleViolation(o, n *locksv1alpha1.DistributedLockStatus) string {
	acquired := 0
	switch {
	case o.Holder != nil && n.Holder != nil && !sameHolding(*o.Holder, *n.Holder):
		return "the holder changed in place (" + o.Holder.LeaseID + ")"
	case o.Holder == nil && n.Holder != nil:
		acquired++
	case o.Holder != nil && n.Holder == nil && !slices.ContainsFunc(n.RecentAcquisitions, func(r locksv1alpha1.FinishedHolding) bool {
		return r.LeaseID == o.Holder.LeaseID && r.Slot == nil
	}):
		return "the holder ended without its record"
	}
	oldAt := map[int32]locksv1alpha1.SharedHolder{}
	for _, e := range o.SharedHolders {
		oldAt[e.Slot] = e
	}
	for _, e := range n.SharedHolders {
		old, kept := oldAt[e.Slot]
		switch {
		case !kept:
			acquired++
		case old.FencingToken != e.FencingToken || !sameHolding(old.LockHolder, e.LockHolder):
			return "a shared holding changed in place on its slot (" + old.LeaseID + ")"
		}
		if e.FencingToken > n.FencingToken {
			return "a shared holding's token above status.fencingToken"
		}
	}
	switch {
	case n.Transitions != o.Transitions+int64(acquired):
		return "transitions that do not count the acquisitions"
	case n.FencingToken < o.FencingToken:
		return "a token that went down"
	}
	return ""
}

// sameHolding reports whether n is o, renewed at most.
func sameHolding(o, n locksv1alpha1.LockHolder) bool {
	o.RenewTime, n.RenewTime = nil, nil
	return equality.Semantic.DeepEqual(o, n)
}

// queueViolation: others' entries and pods' entries stay; the queue grows by one.
func queueViolation(oldObj, newObj *locksv1alpha1.DistributedLock, a Actor) string {
	o, n := &oldObj.Status, &newObj.Status
	_, uid := a.pod()
	for _, w := range o.Waiters {
		i := n.WaiterIndex(w.RequestID)
		kept := i >= 0 && equality.Semantic.DeepEqual(w, n.Waiters[i])
		if !kept && w.User != a.Username {
			return "a change of another user's queue entry " + w.RequestID
		}
		if !kept && w.PodUID != "" && w.PodUID != uid {
			return "a change of another pod's queue entry " + w.RequestID
		}
	}
	added, mine := 0, 0
	for _, w := range n.Waiters {
		if o.WaiterIndex(w.RequestID) < 0 {
			added++
			if w.User != a.Username {
				return "a queue entry in another user's name"
			}
			if d := w.Deadline.Sub(w.EnqueueTime.Time); d <= 0 || d > newObj.MaxWait() {
				return "a wait beyond spec.maxWaitSeconds"
			}
			if oldObj.DeletionTimestamp != nil {
				return "a new waiter on a lock being deleted"
			}
			if msg := podViolation(w.PodName, w.PodUID, a); msg != "" {
				return msg
			}
			if requestUsed(o, w.RequestID) {
				return "a queue entry with a requestID status knows"
			}
		}
		if w.User == a.Username {
			mine++
		}
	}
	switch {
	case added > 1:
		return "more than one new waiter in one write"
	case added == 1 && mine > newObj.MaxWaitersPerUser():
		return "more entries of one user than maxWaitersPerUser"
	}
	return ""
}

var (
	podNameRE = regexp.MustCompile(locksv1alpha1.PodNamePattern)
	podUIDRE  = regexp.MustCompile(locksv1alpha1.PodUIDPattern)
)

// podViolation: a new holding's or waiter's pod fields are the writer's
// token's (none from a token bound to no pod), a pod's name and UID as the
// CRD's patterns say.
func podViolation(name, uid string, a Actor) string {
	myName, myUID := a.pod()
	switch {
	case name != myName || uid != myUID:
		return "a new entry naming a pod its writer's token is not bound to"
	case name != "" && (len(name) > 253 || !podNameRE.MatchString(name)):
		return "a new entry whose podName is no pod's name"
	case uid != "" && !podUIDRE.MatchString(uid):
		return "a new entry whose podUID is no pod's UID"
	}
	return ""
}

func dump(s locksv1alpha1.DistributedLockStatus) string {
	b, err := json.Marshal(s)
	if err != nil {
		return fmt.Sprintf("%+v", s)
	}
	return string(b)
}

// FuzzValidateSharedUpdate feeds random writes of RWMutexes and Semaphores
// to the pure rules and checks, for every accepted write, what the shared
// rules exist for. Its corpus (testdata/fuzz/FuzzValidateSharedUpdate) holds
// the hostile suite's shapes; TestSharedFuzzCorpusShapes says which.
func FuzzValidateSharedUpdate(f *testing.F) {
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		s := &bytesource{b: data}
		oldObj := s.sharedLock()
		newObj := oldObj.DeepCopy()
		expectNoAcceptedViolation(t, oldObj, newObj, s.actor(s.mutateShared(newObj)))
	})
}

// sharedViolation is the oracle of the shared rules: what no accepted write may do.
func sharedViolation(oldObj, newObj *locksv1alpha1.DistributedLock, a Actor) string {
	o, n := &oldObj.Status, &newObj.Status
	switch {
	case n.Holder != nil && len(n.SharedHolders) > 0:
		return "an exclusive and a shared holding together"
	case len(n.SharedHolders) > 0 && !newObj.Supports(locksv1alpha1.Shared):
		return "a shared holding of a " + string(newObj.LockType())
	case n.Holder != nil && !newObj.Supports(locksv1alpha1.Exclusive):
		return "an exclusive holding of a " + string(newObj.LockType())
	case n.HolderCount != holderCount(n):
		return "a holderCount that does not count the holdings"
	}
	slots := map[int32]bool{}
	for _, e := range n.SharedHolders {
		if slots[e.Slot] || e.Slot < 0 || int(e.Slot) >= newObj.SharedLimit() {
			return "a slot taken twice or out of range"
		}
		slots[e.Slot] = true
	}
	return sharedOwnerViolation(o, n, a)
}

// sharedOwnerViolation: only an entry's owner (or the controller, or a
// breaker) renews, changes or ends it, and every ended entry is recorded.
func sharedOwnerViolation(o, n *locksv1alpha1.DistributedLockStatus, a Actor) string {
	_, uid := a.pod()
	for _, e := range o.SharedHolders {
		owner := a.Username == e.User && (e.PodUID == "" || e.PodUID == uid)
		i := n.SharedIndex(e.LeaseID)
		if i < 0 {
			if !owner && !a.IsController && !mayForce(a) {
				return "a shared holding ended by someone who is not its owner " + e.LeaseID
			}
			if !recorded(n, e) {
				return "a shared holding ended without its record " + e.LeaseID
			}
			continue
		}
		k := n.SharedHolders[i]
		if k.Slot != e.Slot || k.FencingToken != e.FencingToken {
			return "a shared holding's slot or token changed " + e.LeaseID
		}
		if !equality.Semantic.DeepEqual(k, e) && !owner {
			return "a shared holding changed by someone who is not its owner " + e.LeaseID
		}
	}
	return ""
}

func recorded(n *locksv1alpha1.DistributedLockStatus, e locksv1alpha1.SharedHolder) bool {
	for _, r := range n.RecentAcquisitions {
		if r.LeaseID == e.LeaseID && r.Slot != nil && *r.Slot == e.Slot && r.FencingToken == e.FencingToken {
			return true
		}
	}
	return false
}

// newHoldingViolation: at most one new holding per write, the writer's own,
// with a fresh lease ID, the server's token, taken by the queue's head.
func newHoldingViolation(oldObj, newObj *locksv1alpha1.DistributedLock, a Actor) string {
	o, n := &oldObj.Status, &newObj.Status
	var fresh []*locksv1alpha1.LockHolder
	var tokens []int64
	if n.Holder != nil && (o.Holder == nil || o.Holder.LeaseID != n.Holder.LeaseID) {
		fresh, tokens = append(fresh, n.Holder), append(tokens, n.FencingToken)
	}
	for i := range n.SharedHolders {
		if e := &n.SharedHolders[i]; o.SharedIndex(e.LeaseID) < 0 {
			fresh, tokens = append(fresh, &e.LockHolder), append(tokens, e.FencingToken)
		}
	}
	want, _ := locksv1alpha1.NextFencingToken(oldObj.ResourceVersion)
	switch {
	case len(fresh) > 1:
		return "two new holdings in one write"
	case len(fresh) == 0 && n.FencingToken != o.FencingToken:
		return "a token change without an acquisition"
	case len(fresh) == 0:
		return ""
	case a.IsController:
		return "an acquisition by the controller"
	case fresh[0].User != a.Username:
		return "an acquisition in another user's name"
	case podViolation(fresh[0].PodName, fresh[0].PodUID, a) != "":
		return podViolation(fresh[0].PodName, fresh[0].PodUID, a)
	case tokens[0] != want || n.FencingToken != want:
		return "an acquisition with a token other than resourceVersion + 1"
	case leaseUsed(o, fresh[0].LeaseID):
		return "an acquisition reusing a lease ID"
	case requestUsed(o, fresh[0].RequestID):
		return "an acquisition reusing a requestID status knows"
	case n.WaiterIndex(fresh[0].RequestID) >= 0:
		return "an acquisition whose requestID stays in the queue"
	case len(o.Waiters) > 0 && (o.Waiters[0].RequestID != fresh[0].RequestID || o.Waiters[0].User != a.Username):
		return "an acquisition past the queue's head"
	}
	return ""
}
