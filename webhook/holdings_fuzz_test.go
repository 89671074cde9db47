package webhook

import (
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// Shared shapes (issue 16): RWMutex readers and writers, Semaphore permits.
var (
	fuzzTypes       = []locksv1alpha1.LockType{locksv1alpha1.RWMutex, locksv1alpha1.Semaphore, locksv1alpha1.RWMutex, locksv1alpha1.Semaphore, locksv1alpha1.Mutex}
	fuzzSharedLease = []string{"lease-0000000001", "lease-0000000002", "lease-0000000003", "lease-0000000004", "lease-0000000005", "lease-0000000006", "lease-0000000007"}
	fuzzSlots       = []int32{0, 1, 2, 3, 0, 1, 1023, 1024, -1}
	fuzzReasons     = []locksv1alpha1.EndReason{locksv1alpha1.EndReasonReleased, locksv1alpha1.EndReasonReleased, locksv1alpha1.EndReasonExpired,
		locksv1alpha1.EndReasonForceReleased, locksv1alpha1.EndReasonSessionExpired, "Stolen"}
)

func (s *bytesource) mode(l *locksv1alpha1.DistributedLock) locksv1alpha1.Mode {
	if s.intn(8) == 0 { // sometimes one the type does not support
		return pick(s, locksv1alpha1.Exclusive, locksv1alpha1.Shared)
	}
	switch l.LockType() {
	case locksv1alpha1.RWMutex:
		return pick(s, locksv1alpha1.Exclusive, locksv1alpha1.Shared)
	case locksv1alpha1.Semaphore:
		return locksv1alpha1.Shared
	}
	return locksv1alpha1.Exclusive
}

// freshLease is a lease ID the lock's status does not use, or a used one
// when the bytes say so.
func (s *bytesource) freshLease(st *locksv1alpha1.DistributedLockStatus) string {
	id := pick(s, fuzzSharedLease...)
	for _, c := range fuzzSharedLease {
		if s.intn(8) == 0 || !leaseUsed(st, c) {
			return c
		}
	}
	return id
}

func leaseUsed(st *locksv1alpha1.DistributedLockStatus, id string) bool {
	if st.Holder != nil && st.Holder.LeaseID == id {
		return true
	}
	for _, r := range st.RecentAcquisitions {
		if r.LeaseID == id {
			return true
		}
	}
	return st.SharedIndex(id) >= 0
}

// requestUsed reports whether a retried acquire of id would find it in st:
// a current holding or a record of recentAcquisitions has it.
func requestUsed(st *locksv1alpha1.DistributedLockStatus, id string) bool {
	if st.Holder != nil && st.Holder.RequestID == id || st.FindFinished(id) != nil {
		return true
	}
	return slices.ContainsFunc(st.SharedHolders, func(h locksv1alpha1.SharedHolder) bool { return h.RequestID == id })
}

// sharedLock builds a plausible stored lock of a shared type: readers or a
// writer, permits, waiters of either mode, history with slots.
func (s *bytesource) sharedLock() *locksv1alpha1.DistributedLock {
	l := free()
	l.Generation = 1
	l.Spec.Type = pick(s, fuzzTypes...)
	if l.Spec.Type == locksv1alpha1.Semaphore {
		p := int32(1 + s.intn(4))
		l.Spec.Permits = &p
	}
	if s.intn(6) == 0 {
		ts := metav1.NewTime(now.Time)
		l.DeletionTimestamp = &ts
	}
	for range s.intn(4) {
		w := s.waiter()
		w.Mode = s.mode(l)
		if l.Status.WaiterIndex(w.RequestID) < 0 {
			l.Status.AppendWaiter(w)
		}
	}
	for i := range s.intn(4) {
		r := locksv1alpha1.FinishedHolding{RequestID: pick(s, fuzzReqs...), LeaseID: pick(s, fuzzSharedLease...), FencingToken: int64(40 + i),
			Identity: "h", EndTime: s.time(), EndReason: locksv1alpha1.EndReasonReleased, EndedBy: pick(s, fuzzUsers...)}
		if s.bool() {
			slot := int32(s.intn(3))
			r.Slot = &slot
		}
		l.Status.RecentAcquisitions = append(l.Status.RecentAcquisitions, r)
	}
	if l.Supports(locksv1alpha1.Exclusive) && s.intn(4) == 0 {
		h := s.holder()
		h.LeaseID = s.freshLease(&l.Status)
		l.Acquire(*h, l.Status.FencingToken+1)
	} else if l.Supports(locksv1alpha1.Shared) {
		for range s.intn(5) {
			slot, ok := l.FreeSlot()
			if !ok {
				break
			}
			h := s.holder()
			h.LeaseID = s.freshLease(&l.Status)
			if leaseUsed(&l.Status, h.LeaseID) {
				continue
			}
			l.AcquireShared(*h, slot, l.Status.FencingToken+1)
		}
	}
	l.ResourceVersion = "200"
	return l
}

// mutateShared edits n with shared-mode transitions, mostly the protocol's
// own, sometimes hostile, and returns the actor the last one would come from.
func (s *bytesource) mutateShared(n *locksv1alpha1.DistributedLock) *Actor {
	st := &n.Status
	var hint *Actor
	entry := func() *locksv1alpha1.SharedHolder {
		if len(st.SharedHolders) == 0 {
			return nil
		}
		return &st.SharedHolders[s.intn(len(st.SharedHolders))]
	}
	for range 1 + s.intn(3) {
		switch s.intn(20) {
		case 0, 1, 2:
			h := s.holder()
			var head *locksv1alpha1.Waiter
			if len(st.Waiters) > 0 && s.intn(4) != 0 {
				head = &st.Waiters[0]
				h.RequestID, h.User, h.PodName, h.PodUID = head.RequestID, head.User, head.PodName, head.PodUID
			}
			h.LeaseID = s.freshLease(st)
			slot, ok := n.FreeSlot()
			if !ok || s.intn(6) == 0 {
				slot = pick(s, fuzzSlots...)
			}
			token, _ := locksv1alpha1.NextFencingToken(n.ResourceVersion)
			keep := head != nil && s.intn(8) == 0 // the head stays at the head (red team)
			var w locksv1alpha1.Waiter
			if keep {
				w = *head
			}
			n.AcquireShared(*h, slot, token+int64(pick(s, 0, 0, 0, 0, 1, -1)))
			if keep {
				st.Waiters = append([]locksv1alpha1.Waiter{w}, st.Waiters...)
				st.WaiterCount = int32(len(st.Waiters))
			}
			hint = actorOf(h.User, h.PodName)
		case 3:
			if st.Holder == nil {
				h := s.holder()
				h.LeaseID = s.freshLease(st)
				token, _ := locksv1alpha1.NextFencingToken(n.ResourceVersion)
				n.Acquire(*h, token)
				hint = actorOf(h.User, h.PodName)
			}
		case 4, 5, 6:
			if e := entry(); e != nil {
				reason := pick(s, fuzzReasons...)
				hint = actorOf(e.User, e.PodName)
				switch reason {
				case locksv1alpha1.EndReasonExpired, locksv1alpha1.EndReasonSessionExpired:
					hint = &Actor{Username: ctrlr, IsController: true}
				case locksv1alpha1.EndReasonForceReleased:
					hint = &Actor{Username: pick(s, fuzzUsers...), CanForceRelease: true}
				}
				n.EndShared(e.LeaseID, reason, hint.Username, s.time())
			}
		case 7, 8:
			if e := entry(); e != nil {
				t := s.time()
				e.RenewTime = &t
				hint = actorOf(e.User, e.PodName)
			}
		case 9:
			if e := entry(); e != nil {
				e.Slot = pick(s, fuzzSlots...)
			}
		case 10:
			if e := entry(); e != nil {
				e.FencingToken += int64(int8(s.next()))
			}
		case 11:
			if e := entry(); e != nil {
				i := st.SharedIndex(e.LeaseID)
				st.SharedHolders = append(st.SharedHolders[:i:i], st.SharedHolders[i+1:]...)
				st.HolderCount = holderCount(st)
			}
		case 12:
			if h := st.Holder; h != nil {
				hint = actorOf(h.User, h.PodName)
				n.EndHolding(pick(s, fuzzReasons...), h.User, s.time())
			}
		case 13:
			hint = s.join(st, s.mode(n), hint)
		case 14:
			hint = s.leave(st, hint)
		case 15:
			st.FencingToken += int64(int8(s.next()))
		case 16:
			if e := entry(); e != nil {
				e.LeaseID = pick(s, fuzzSharedLease...)
			}
		case 17:
			if e := entry(); e != nil {
				e.LeaseDurationSeconds++
				e.PodUID = uidOf(pick(s, fuzzPods...))
			}
		case 18:
			if len(st.Conditions) > 0 {
				st.Conditions[0].Status = pick(s, metav1.ConditionTrue, metav1.ConditionFalse)
			}
		case 19:
			st.HolderCount += int32(pick(s, 1, -1))
		}
	}
	return hint
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
			if !owner && !a.IsController && !a.CanForceRelease {
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
