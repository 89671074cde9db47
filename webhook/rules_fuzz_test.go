package webhook

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/kube-openapi/pkg/validation/strfmt"

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
					hint = &Actor{Username: pick(s, fuzzUsers...), CanForceRelease: true}
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
	a := Actor{Username: pick(s, fuzzUsers...), CanForceRelease: s.intn(4) == 0}
	a.IsController = a.Username == ctrlr && s.intn(4) != 0
	if pod := pick(s, fuzzPods...); pod != "" {
		a.Extra = map[string][]string{ExtraPodName: {pod}, ExtraPodUID: {uidOf(pod)}}
	}
	return a
}

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
	if o.Holder != nil && !a.CanForceRelease && (a.Username != o.Holder.User || (o.Holder.PodUID != "" && uid != o.Holder.PodUID)) {
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

// FuzzTimeStrings holds the CRD's time patterns (with the apiserver's own
// date-time format check) and the raw check to Go's parsers: whatever they
// accept, Go reads, and writes back in a form they accept again.
func FuzzTimeStrings(f *testing.F) {
	for _, s := range []string{"2026-11-29T09:00:00.123456Z", "2026-11-29T09:00:00Z", "2026-11-29t09:00:00.000000Z",
		"0000-01-01T00:30:00.000000+01:00", "9999-12-31T23:30:00.000000-01:00", "2026-02-29T09:00:00.000000Z",
		"2026-12-31T23:59:60.000000Z", "2026-11-29T09:00:00.000000+23:59", "2026-11-29T09:00:00.5-02:30"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		crd := strfmt.IsDateTime(s)
		if microTimeRE.MatchString(s) && crd {
			var m metav1.MicroTime
			if err := m.UnmarshalJSON(quote(s)); err != nil {
				t.Fatalf("the CRD accepts MicroTime %q, Go does not: %v", s, err)
			}
			if b, _ := m.MarshalJSON(); !ValidMicroTime(unquote(t, b)) {
				t.Fatalf("MicroTime %q is written back as %s, which the CRD refuses", s, b)
			}
		}
		if timeRE.MatchString(s) && crd {
			var m metav1.Time
			if err := m.UnmarshalJSON(quote(s)); err != nil {
				t.Fatalf("the pattern accepts Time %q, Go does not: %v", s, err)
			}
			if b, _ := m.MarshalJSON(); !ValidTime(unquote(t, b)) {
				t.Fatalf("Time %q is written back as %s, which the pattern refuses", s, b)
			}
		}
		raw := `{"status":{"holder":{"acquireTime":` + string(quote(s)) + `},"conditions":[{"lastTransitionTime":` + string(quote(s)) + `}]}}`
		if len(ValidateRawStatusTimes([]byte(raw))) == 0 {
			var l locksv1alpha1.DistributedLock
			if err := json.Unmarshal([]byte(raw), &l); err != nil {
				t.Fatalf("the raw check accepts %q, Go does not: %v", s, err)
			}
		}
		if v, err := strconv.Unquote(`"` + s + `"`); err == nil && ValidMicroTime(v) && !microTimeRE.MatchString(v) {
			t.Fatalf("ValidMicroTime accepts %q outside the pattern", v)
		}
	})
}

func unquote(t *testing.T, b []byte) string {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("unquote %s: %v", b, err)
	}
	return s
}

func quote(s string) []byte {
	b, _ := json.Marshal(s)
	return b
}
