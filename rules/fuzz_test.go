package rules

import (
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// bytesource turns fuzz bytes into choices; once the bytes run out every
// choice is 0, so short inputs still build whole objects.
type bytesource struct{ b []byte }

func (s *bytesource) next() byte {
	if len(s.b) == 0 {
		return 0
	}
	c := s.b[0]
	s.b = s.b[1:]
	return c
}

func (s *bytesource) intn(n int) int { return int(s.next()) % n }

func (s *bytesource) bool() bool { return s.next()&1 == 1 }

func pick[T any](s *bytesource, xs ...T) T { return xs[s.intn(len(xs))] }

var (
	fuzzUsers = []string{alice, bob, "carol", ctrlr}
	// fuzzPods are the pods tokens are bound to ("" for none); badPod's
	// token (an impersonated extra) names no pod's name and no pod's UID.
	fuzzPods   = []string{"", "p0", "p1", badPod}
	fuzzLeases = []string{"lease-0000000001", "lease-0000000002", "lease-0000000003", "lease-0000000004"}
	fuzzReqs   = []string{"r0", "r1", "r2", "r3", "r4", "r5"}
	fuzzZones  = []*time.Location{time.UTC, time.FixedZone("", 3600), time.FixedZone("", -5*3600-1800)}
)

// badPod is a podName the controller's read of the pod would turn into a
// read of another URL.
const badPod = "../../../../../version"

// fuzzPodUIDs are the UIDs of the pods p0 and p1.
var fuzzPodUIDs = map[string]string{"p0": "6a1f0c3e-2b4d-4e5f-8a9b-0c1d2e3f4a5b", "p1": "7b2e1d4f-3c5e-4f60-9bac-1d2e3f4a5b6c"}

// uidOf is the UID of pod's bound token: p0's and p1's are UIDs, any
// other's (no pod's, "" included) is not.
func uidOf(pod string) string {
	if uid, ok := fuzzPodUIDs[pod]; ok {
		return uid
	}
	return "uid-" + pod
}

// time picks instants near now, at odd sub-microsecond offsets, and at the ends
// of the years Go can write.
func (s *bytesource) time() metav1.MicroTime {
	base := pick(s, now.Time, now.Time, now.Time, now.Time, now.Time,
		time.Date(0, 1, 1, 0, 30, 0, 0, fuzzZones[1]),
		time.Date(9999, 12, 31, 23, 30, 0, 0, fuzzZones[2]),
		time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC))
	d := time.Duration(int8(s.next())) * pick(s, time.Nanosecond, time.Microsecond, time.Second, time.Minute, time.Hour, 24*time.Hour)
	return metav1.NewMicroTime(base.Add(d).In(pick(s, fuzzZones...)))
}

func (s *bytesource) waiter() locksv1alpha1.Waiter {
	pod := pick(s, fuzzPods...)
	enq := s.time()
	wait := pick(s, time.Microsecond, 30*time.Second, time.Minute, 59*time.Minute, time.Hour, time.Hour+time.Microsecond, 0, -time.Second)
	w := locksv1alpha1.Waiter{Identity: "w", User: pick(s, fuzzUsers...), RequestID: pick(s, fuzzReqs...), EnqueueTime: enq,
		Deadline: metav1.NewMicroTime(enq.Add(wait))}
	if s.intn(8) == 0 {
		w.Deadline = s.time()
	}
	if pod != "" {
		w.PodName, w.PodUID = pod, uidOf(pod)
	}
	return w
}

func (s *bytesource) holder() *locksv1alpha1.LockHolder {
	pod := pick(s, fuzzPods...)
	t := s.time()
	h := &locksv1alpha1.LockHolder{Identity: "h", User: pick(s, fuzzUsers...), LeaseID: pick(s, fuzzLeases...),
		RequestID: pick(s, fuzzReqs...), LeaseDurationSeconds: 30, AcquireTime: t, RenewTime: &t}
	if pod != "" {
		h.PodName, h.PodUID = pod, uidOf(pod)
	}
	return h
}

func (s *bytesource) condition(l *locksv1alpha1.DistributedLock) metav1.Condition {
	return metav1.Condition{
		Type:               pick(s, locksv1alpha1.ConditionHeld, "Other"),
		Status:             pick(s, metav1.ConditionTrue, metav1.ConditionFalse),
		Reason:             pick(s, locksv1alpha1.ReasonAcquired, locksv1alpha1.ReasonReleased, locksv1alpha1.ReasonNeverHeld, "Bogus"),
		ObservedGeneration: l.Generation + int64(s.intn(2)),
		LastTransitionTime: metav1.NewTime(s.time().Time),
	}
}

// lock builds a plausible old object: free or held, with a queue and history.
func (s *bytesource) lock() *locksv1alpha1.DistributedLock {
	l := free()
	l.Generation = int64(s.intn(3))
	l.Status.ObservedGeneration = int64(s.intn(3))
	if s.intn(4) == 0 {
		ts := metav1.NewTime(now.Time)
		l.DeletionTimestamp = &ts
	}
	if s.bool() {
		n := int32(s.intn(4))
		l.Spec.MaxWaitersPerUser = &n
	}
	l.Spec.MaxWaitSeconds = int32(pick(s, 0, 60, 3600))
	seen := map[string]bool{}
	for range s.intn(5) {
		if w := s.waiter(); !seen[w.RequestID] {
			seen[w.RequestID] = true
			l.Status.AppendWaiter(w)
		}
	}
	for i := range s.intn(3) {
		l.Status.RecentAcquisitions = append(l.Status.RecentAcquisitions, locksv1alpha1.FinishedHolding{
			RequestID: pick(s, fuzzReqs...), LeaseID: pick(s, fuzzLeases...), FencingToken: int64(40 + i), Identity: "h",
			EndTime: s.time(), EndReason: locksv1alpha1.EndReasonReleased, EndedBy: pick(s, fuzzUsers...),
		})
	}
	if s.bool() {
		l.Acquire(*s.holder(), l.Status.FencingToken+1)
		l.ResourceVersion = "200"
	}
	for range s.intn(3) {
		l.Status.Conditions = append(l.Status.Conditions, s.condition(l))
	}
	return l
}

// mutate applies a few edits to n, mostly the protocol's own transitions, so
// that many writes are accepted and the oracle has something to judge. It
// returns the actor the last transition would come from, if there is one.
func (s *bytesource) mutate(n *locksv1alpha1.DistributedLock) *Actor {
	st := &n.Status
	var hint *Actor
	for range 1 + s.intn(3) {
		switch s.intn(19) {
		case 0, 16:
			if st.Holder == nil {
				h := s.holder()
				if len(st.Waiters) > 0 && s.intn(4) != 0 {
					head := st.Waiters[0]
					h.RequestID, h.User, h.PodName, h.PodUID = head.RequestID, head.User, head.PodName, head.PodUID
				}
				token, _ := locksv1alpha1.NextFencingToken(n.ResourceVersion)
				n.Acquire(*h, token)
				hint = actorOf(h.User, h.PodName)
			}
		case 1:
			if h := st.Holder; h != nil {
				reason := pick(s, locksv1alpha1.EndReasonReleased, locksv1alpha1.EndReasonExpired, locksv1alpha1.EndReasonForceReleased)
				hint = actorOf(h.User, h.PodName)
				switch reason {
				case locksv1alpha1.EndReasonExpired:
					hint = &Actor{Username: ctrlr, IsController: true}
				case locksv1alpha1.EndReasonForceReleased:
					hint = &Actor{Username: pick(s, fuzzUsers...), Authorizer: allow(locksv1alpha1.ForceReleaseVerb)}
				}
				n.EndHolding(reason, hint.Username, s.time())
			}
		case 2:
			if h := st.Holder; h != nil {
				t := s.time()
				h.RenewTime = &t
				hint = actorOf(h.User, h.PodName)
			}
		case 3, 17:
			hint = s.join(st, "", hint)
		case 4:
			hint = s.leave(st, hint)
		case 5:
			st.FencingToken += int64(int8(s.next()))
		case 6:
			if st.Holder != nil {
				*st.Holder = *s.holder()
			} else {
				st.Holder = s.holder()
			}
		case 7:
			if len(st.Waiters) > 0 {
				st.Waiters[s.intn(len(st.Waiters))] = s.waiter()
			}
		case 8:
			st.Conditions = append(st.Conditions, s.condition(n))
		case 9:
			st.Conditions = nil
		case 10:
			st.ObservedGeneration = int64(s.intn(4))
		case 11:
			if len(st.RecentAcquisitions) > 0 {
				st.RecentAcquisitions[s.intn(len(st.RecentAcquisitions))].EndTime = s.time()
			}
		case 12:
			if len(st.Waiters) > 1 {
				st.Waiters[0], st.Waiters[1] = st.Waiters[1], st.Waiters[0]
			}
		case 13:
			st.Holder = nil
		case 14:
			if len(st.Conditions) > 0 {
				st.Conditions[0] = s.condition(n)
			}
		case 15:
			if st.Holder != nil {
				st.Holder.PodUID = uidOf(pick(s, fuzzPods...))
			}
		case 18:
			st.Transitions += int64(pick(s, 1, -1))
		}
	}
	return hint
}

// join appends a generated waiter of mode ("" for the CRD's default) unless
// its requestID waits already; it returns the waiter's actor, else hint.
func (s *bytesource) join(st *locksv1alpha1.DistributedLockStatus, mode locksv1alpha1.Mode, hint *Actor) *Actor {
	w := s.waiter()
	w.Mode = mode
	if st.WaiterIndex(w.RequestID) >= 0 {
		return hint
	}
	st.AppendWaiter(w)
	return actorOf(w.User, w.PodName)
}

// leave removes a queue entry, if there is one, and returns its actor, else hint.
func (s *bytesource) leave(st *locksv1alpha1.DistributedLockStatus, hint *Actor) *Actor {
	if len(st.Waiters) == 0 {
		return hint
	}
	w := st.Waiters[s.intn(len(st.Waiters))]
	st.RemoveWaiter(w.RequestID)
	return actorOf(w.User, w.PodName)
}

// actorOf is user writing from pod ("" for none), as a bound token names it.
func actorOf(user, pod string) *Actor {
	a := &Actor{Username: user, IsController: user == ctrlr}
	if pod != "" {
		a.Extra = map[string][]string{ExtraPodName: {pod}, ExtraPodUID: {uidOf(pod)}}
	}
	return a
}

// actor is mostly the one the transition calls for, else anyone.
func (s *bytesource) actor(hint *Actor) Actor {
	if hint != nil && s.intn(4) != 0 {
		return *hint
	}
	a := Actor{Username: pick(s, fuzzUsers...)}
	if s.intn(4) == 0 {
		a.Authorizer = allow(locksv1alpha1.ForceReleaseVerb)
	}
	a.IsController = a.Username == ctrlr && s.intn(4) != 0
	if pod := pick(s, fuzzPods...); pod != "" {
		a.Extra = map[string][]string{ExtraPodName: {pod}, ExtraPodUID: {uidOf(pod)}}
	}
	return a
}

// Shared shapes: RWMutex readers and writers, Semaphore permits.
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
			keep := head != nil && s.intn(8) == 0 // the head stays at the head
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
					hint = &Actor{Username: pick(s, fuzzUsers...), Authorizer: allow(locksv1alpha1.ForceReleaseVerb)}
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
