package rules

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

var fuzzSessionNames = []string{"s0", "s1", "s2"}

// session builds a plausible stored session: any user's, pod-bound or not.
func (s *bytesource) session() *locksv1alpha1.LockSession {
	ls := &locksv1alpha1.LockSession{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: pick(s, fuzzSessionNames...)},
		Spec:       locksv1alpha1.LockSessionSpec{User: pick(s, fuzzUsers...), Identity: "w", TTLSeconds: 30},
		Status:     locksv1alpha1.LockSessionStatus{Locks: int32(s.intn(4))},
	}
	if pod := pick(s, fuzzPods...); pod != "" {
		ls.Spec.PodName, ls.Spec.PodUID = pod, uidOf(pod)
		ls.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod, UID: types.UID(uidOf(pod))}}
	}
	if s.bool() {
		t := s.time()
		ls.Status.RenewTime = &t
	}
	if s.intn(4) == 0 {
		ls.DeletionTimestamp = &metav1.Time{Time: now.Time}
	}
	return ls
}

// mutateSession edits n the way renewals, counts and hostile writes do.
func (s *bytesource) mutateSession(n *locksv1alpha1.LockSession) {
	for range 1 + s.intn(3) {
		switch s.intn(9) {
		case 0, 1:
			t := s.time()
			n.Status.RenewTime = &t
		case 2:
			n.Status.RenewTime = nil
		case 3:
			n.Status.Locks = int32(s.intn(4))
		case 4:
			n.Finalizers = append(n.Finalizers, "x/y")
		case 5:
			n.OwnerReferences = nil
		case 6:
			pod := pick(s, fuzzPods...)
			n.Spec.PodName, n.Spec.PodUID = pod, uidOf(pod)
		case 7:
			n.Spec.User = pick(s, fuzzUsers...)
		case 8:
			n.Labels = map[string]string{}
			for i := range s.intn(20) {
				n.Labels[fmt.Sprint(i)] = ""
			}
			// Up to the apiserver's 256 kB: the controller caches every session.
			n.Annotations = map[string]string{"a": strings.Repeat("v", pick(s, 0, MaxCreateAnnotationBytes-1, MaxCreateAnnotationBytes, 250_000))}
		}
	}
}

func (s *bytesource) sessionActor() Actor {
	a := s.actor(nil)
	a.IsGarbageCollector = s.intn(6) == 0
	return a
}

// FuzzValidateSessionRules feeds random sessions, edits and writers to the
// session rules and checks, for every accepted write, what they exist for.
func FuzzValidateSessionRules(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("\x01\x00\x01\x00\x01\x00\x00\x00\x01\x00\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s := &bytesource{b: data}
		op := s.intn(4)
		oldObj := s.session()
		newObj := oldObj.DeepCopy()
		s.mutateSession(newObj)
		a := s.sessionActor()
		_, uid := a.pod()
		user, pod := a.owns(oldObj)
		var msg string
		switch op {
		case 0:
			if len(ValidateSessionCreate(newObj, a)) > 0 {
				return
			}
			name, _ := a.pod()
			switch {
			case newObj.Spec.User != a.Username:
				msg = "a session in another user's name"
			case newObj.Spec.PodUID != uid || newObj.Spec.PodName != name:
				msg = "pod fields that are not the writer's pod"
			case podViolation(name, uid, a) != "":
				msg = "pod fields that are no pod's name and UID"
			case uid != "" && !podOwner(newObj.OwnerReferences, name, uid):
				msg = "a pod's session not owned by exactly that pod"
			case uid == "" && len(newObj.OwnerReferences) > 0:
				msg = "an ownerReference without a pod-bound token"
			case len(newObj.Finalizers) > 0:
				msg = "a session created with finalizers"
			case sessionAnnotationBytes(newObj) > MaxCreateAnnotationBytes:
				msg = "a session created with more annotation bytes than the bound"
			case uid != "" && strings.HasPrefix(a.Username, "system:serviceaccount:") && !strings.HasPrefix(a.Username, "system:serviceaccount:"+newObj.Namespace+":"):
				msg = "a pod's session outside its pod's namespace"
			}
		case 1:
			if len(ValidateSessionStatus(oldObj, newObj, a)) > 0 {
				return
			}
			o, n := oldObj.Status, newObj.Status
			switch {
			case a.IsController && !equality.Semantic.DeepEqual(o.RenewTime, n.RenewTime):
				msg = "a renewal by the controller"
			case !a.IsController && !(user && pod):
				msg = "a status write by someone who is not the session's owner in its pod"
			case !a.IsController && o.Locks != n.Locks:
				msg = "a count written by the owner"
			case !a.IsController && o.RenewTime != nil && (n.RenewTime == nil || n.RenewTime.Before(o.RenewTime)):
				msg = "a renewal that went backwards"
			}
		case 2:
			if len(ValidateSessionUpdate(oldObj, newObj, a)) > 0 || a.IsGarbageCollector {
				return
			}
			switch {
			case !(user && pod):
				msg = "an update by someone who is not the owner in its pod"
			case !equality.Semantic.DeepEqual(oldObj.OwnerReferences, newObj.OwnerReferences) || !slices.Equal(oldObj.Finalizers, newObj.Finalizers):
				msg = "ownerReferences or finalizers changed by the owner"
			case len(newObj.Labels) > maxSessionMeta:
				msg = "more labels than the bound"
			case sessionAnnotationBytes(newObj) > MaxCreateAnnotationBytes:
				msg = "more annotation bytes than the bound"
			}
		case 3:
			if len(ValidateSessionDelete(oldObj, a)) == 0 && !(user && pod) && !a.IsController && !a.IsGarbageCollector && !mayForce(a) {
				msg = "a close by someone else"
			}
		}
		if msg != "" {
			t.Fatalf("accepted %s\nop %d actor %+v\nold %+v\nnew %+v", msg, op, a, oldObj, newObj)
		}
	})
}

// FuzzValidateSessionRefs holds the lock rules plus the session references
// to their purpose: an accepted write never puts a holding or waiter in a
// session that is missing, terminating, another user's or another pod's (or no
// pod's, for a pod's holding or waiter), or
// (a holding) whose TTL exceeds the lock's maxLeaseDurationSeconds, and never
// renews a holding that is in a session.
func FuzzValidateSessionRefs(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x01"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s := &bytesource{b: data}
		oldObj := s.lock()
		if h := oldObj.Status.Holder; h != nil && s.bool() {
			h.Session = pick(s, fuzzSessionNames...)
		}
		newObj := oldObj.DeepCopy()
		a := s.actor(s.mutate(newObj))
		if h := newObj.Status.Holder; h != nil && oldObj.Status.Holder == nil && s.bool() {
			h.Session = pick(s, fuzzSessionNames...)
		}
		for _, i := range addedWaiters(&oldObj.Status, &newObj.Status) {
			if s.bool() {
				newObj.Status.Waiters[i].Session = pick(s, fuzzSessionNames...)
			}
		}
		sessions := map[string]*locksv1alpha1.LockSession{}
		for range s.intn(4) {
			ls := s.session()
			sessions[ls.Name] = ls
		}
		for _, name := range fuzzSessionNames {
			if ls := sessions[name]; ls != nil && s.bool() {
				ls.Spec.TTLSeconds = locksv1alpha1.MaxLeaseDurationSeconds
			}
		}
		if len(ValidateStatusUpdate(oldObj, newObj, a)) > 0 || len(ValidateSessionRefs(oldObj, newObj, a, sessions)) > 0 {
			return
		}
		o, n := oldObj.Status.Holder, newObj.Status.Holder
		if o != nil && n != nil && o.Session != "" && o.LeaseID == n.LeaseID && !equality.Semantic.DeepEqual(o.RenewTime, n.RenewTime) {
			t.Fatalf("accepted a renewal of a holding in session %s", o.Session)
		}
		_, mine := a.pod()
		for _, r := range newSessionRefs(oldObj, newObj) {
			if r.podUID != "" && mine == "" {
				t.Fatalf("accepted %s with podUID %q from a token bound to no pod", r.path, r.podUID)
			}
			ls := sessions[r.session]
			switch {
			case ls == nil:
				t.Fatalf("accepted %s in a missing session", r.path)
			case ls.DeletionTimestamp != nil:
				t.Fatalf("accepted %s in a terminating session", r.path)
			case ls.Spec.User != a.Username:
				t.Fatalf("accepted %s in %s's session by %s", r.path, ls.Spec.User, a.Username)
			case ls.Spec.PodUID != r.podUID:
				t.Fatalf("accepted %s with podUID %q in pod %s's session", r.path, r.podUID, ls.Spec.PodUID)
			case r.holds && ls.TTL() > newObj.MaxLease():
				t.Fatalf("accepted a holding in session %s of TTL %d beyond the lock's maxLeaseDurationSeconds %d", r.session, ls.TTL(), newObj.MaxLease())
			}
		}
	})
}

// sessionAnnotationBytes is the size of s's annotations, keys and values.
func sessionAnnotationBytes(s *locksv1alpha1.LockSession) int {
	n := 0
	for k, v := range s.Annotations {
		n += len(k) + len(v)
	}
	return n
}
