package rules

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

const gcUser = "system:serviceaccount:kube-system:generic-garbage-collector"

// session is alice's session; with a pod, bound to it as its token names it.
func session(pod string) *locksv1alpha1.LockSession {
	s := &locksv1alpha1.LockSession{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s1"},
		Spec:       locksv1alpha1.LockSessionSpec{User: alice, Identity: "worker", TTLSeconds: 30},
		Status:     locksv1alpha1.LockSessionStatus{RenewTime: &now, Locks: 2},
	}
	if pod != "" {
		s.Spec.PodName, s.Spec.PodUID = pod, uidOf(pod)
		s.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod, UID: types.UID(uidOf(pod))}}
	}
	return s
}

func wantRule(t *testing.T, name string, errs field.ErrorList, allowed bool) {
	t.Helper()
	switch {
	case allowed && len(errs) > 0:
		t.Errorf("%s: denied: %v", name, errs)
	case !allowed && len(errs) == 0:
		t.Errorf("%s: admitted", name)
	case !allowed:
		for _, e := range errs {
			if RuleOf(e) != RuleSession {
				t.Errorf("%s: rule %s, want session: %v", name, RuleOf(e), e)
			}
		}
	}
}

func TestValidateSessionCreate(t *testing.T) {
	cases := []struct {
		name    string
		s       *locksv1alpha1.LockSession
		edit    func(*locksv1alpha1.LockSession)
		actor   Actor
		allowed bool
	}{
		{name: "own session", s: session(""), actor: Actor{Username: alice}, allowed: true},
		{name: "own pod-bound session", s: session("p0"), actor: podActor(alice, "p0"), allowed: true},
		{name: "owner reference with controller false", s: session("p0"), edit: func(s *locksv1alpha1.LockSession) {
			s.OwnerReferences[0].Controller = new(bool)
		}, actor: podActor(alice, "p0"), allowed: true},
		{name: "another user's name", s: session(""), actor: Actor{Username: bob}},
		{name: "forged pod fields without a pod token", s: session("p0"), actor: Actor{Username: alice}},
		{name: "another pod's fields", s: session("p1"), actor: podActor(alice, "p0")},
		{name: "pod token but no pod fields", s: session(""), actor: podActor(alice, "p0")},
		{name: "pod fields without the owner reference", s: session("p0"), edit: func(s *locksv1alpha1.LockSession) {
			s.OwnerReferences = nil
		}, actor: podActor(alice, "p0")},
		{name: "owner reference to another pod", s: session("p0"), edit: func(s *locksv1alpha1.LockSession) {
			s.OwnerReferences[0].UID = types.UID(uidOf("p1"))
		}, actor: podActor(alice, "p0")},
		{name: "owner reference of another kind", s: session("p0"), edit: func(s *locksv1alpha1.LockSession) {
			s.OwnerReferences[0].Kind = "Deployment"
		}, actor: podActor(alice, "p0")},
		{name: "a second owner reference", s: session("p0"), edit: func(s *locksv1alpha1.LockSession) {
			s.OwnerReferences = append(s.OwnerReferences, metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: "c", UID: "u"})
		}, actor: podActor(alice, "p0")},
		{name: "owner reference that blocks the pod's deletion", s: session("p0"), edit: func(s *locksv1alpha1.LockSession) {
			s.OwnerReferences[0].BlockOwnerDeletion = yes()
		}, actor: podActor(alice, "p0")},
		{name: "owner reference as controller", s: session("p0"), edit: func(s *locksv1alpha1.LockSession) {
			s.OwnerReferences[0].Controller = yes()
		}, actor: podActor(alice, "p0")},
		{name: "forged owner reference without a pod token", s: session(""), edit: func(s *locksv1alpha1.LockSession) {
			s.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "p0", UID: types.UID(uidOf("p0"))}}
		}, actor: Actor{Username: alice}},
		{name: "a pod's service account in another namespace", s: session("p0"), edit: func(s *locksv1alpha1.LockSession) {
			s.Spec.User = "system:serviceaccount:other:worker"
		}, actor: podActor("system:serviceaccount:other:worker", "p0")},
		{name: "a pod's service account in the session's namespace", s: session("p0"), edit: func(s *locksv1alpha1.LockSession) {
			s.Spec.User = "system:serviceaccount:ns:worker"
		}, actor: podActor("system:serviceaccount:ns:worker", "p0"), allowed: true},
		{name: "finalizers", s: session(""), edit: func(s *locksv1alpha1.LockSession) { s.Finalizers = []string{"x/y"} }, actor: Actor{Username: alice}},
		{name: "17 labels", s: session(""), edit: func(s *locksv1alpha1.LockSession) { s.Labels = entries(17) }, actor: Actor{Username: alice}},
		{name: "17 annotations", s: session(""), edit: func(s *locksv1alpha1.LockSession) { s.Annotations = entries(17) }, actor: Actor{Username: alice}},
		{name: "16 labels and annotations", s: session(""), edit: func(s *locksv1alpha1.LockSession) {
			s.Labels, s.Annotations = entries(16), entries(16)
		}, actor: Actor{Username: alice}, allowed: true},
		// The controller caches every session (red team).
		{name: "annotations of 4097 bytes", s: session(""), edit: func(s *locksv1alpha1.LockSession) {
			s.Annotations = map[string]string{"k": strings.Repeat("v", MaxCreateAnnotationBytes)}
		}, actor: Actor{Username: alice}},
		{name: "annotations of 4096 bytes", s: session(""), edit: func(s *locksv1alpha1.LockSession) {
			s.Annotations = map[string]string{"k": strings.Repeat("v", MaxCreateAnnotationBytes-1)}
		}, actor: Actor{Username: alice}, allowed: true},
	}
	for _, c := range cases {
		if c.edit != nil {
			c.edit(c.s)
		}
		wantRule(t, c.name, ValidateSessionCreate(c.s, c.actor), c.allowed)
	}
}

func entries(n int) map[string]string {
	m := map[string]string{}
	for i := range n {
		m[strings.Repeat("k", i+1)] = "v"
	}
	return m
}

func TestValidateSessionStatus(t *testing.T) {
	later := metav1.NewMicroTime(now.Add(time.Second))
	earlier := metav1.NewMicroTime(now.Add(-time.Second))
	renewTo := func(t *metav1.MicroTime) func(*locksv1alpha1.LockSession) {
		return func(s *locksv1alpha1.LockSession) { s.Status.RenewTime = t }
	}
	cases := []struct {
		name    string
		pod     string
		edit    func(*locksv1alpha1.LockSession)
		actor   Actor
		allowed bool
	}{
		{name: "owner renews", edit: renewTo(&later), actor: Actor{Username: alice}, allowed: true},
		{name: "owner renews to the same time", edit: renewTo(&now), actor: Actor{Username: alice}, allowed: true},
		{name: "owner renews from its pod", pod: "p0", edit: renewTo(&later), actor: podActor(alice, "p0"), allowed: true},
		{name: "another user renews", edit: renewTo(&later), actor: Actor{Username: bob}},
		{name: "a second pod of the same account renews", pod: "p0", edit: renewTo(&later), actor: podActor(alice, "p1")},
		{name: "the same account outside any pod renews a pod's session", pod: "p0", edit: renewTo(&later), actor: Actor{Username: alice}},
		{name: "renewTime moves backwards", edit: renewTo(&earlier), actor: Actor{Username: alice}},
		{name: "renewTime removed", edit: renewTo(nil), actor: Actor{Username: alice}},
		{name: "owner writes the count", edit: func(s *locksv1alpha1.LockSession) { s.Status.Locks = 0 }, actor: Actor{Username: alice}},
		{name: "controller counts", edit: func(s *locksv1alpha1.LockSession) { s.Status.Locks = 7 }, actor: Actor{Username: ctrlr, IsController: true}, allowed: true},
		{name: "controller renews", edit: renewTo(&later), actor: Actor{Username: ctrlr, IsController: true}},
		{name: "garbage collector renews", edit: renewTo(&later), actor: Actor{Username: gcUser}},
	}
	for _, c := range cases {
		o := session(c.pod)
		n := o.DeepCopy()
		c.edit(n)
		wantRule(t, c.name, ValidateSessionStatus(o, n, c.actor), c.allowed)
	}
}

func TestValidateSessionUpdate(t *testing.T) {
	cases := []struct {
		name    string
		edit    func(*locksv1alpha1.LockSession)
		actor   Actor
		allowed bool
	}{
		{name: "owner labels it", edit: func(s *locksv1alpha1.LockSession) { s.Labels = entries(3) }, actor: podActor(alice, "p0"), allowed: true},
		{name: "owner labels it too much", edit: func(s *locksv1alpha1.LockSession) { s.Labels = entries(17) }, actor: podActor(alice, "p0")},
		{name: "another user labels it", edit: func(s *locksv1alpha1.LockSession) { s.Labels = entries(1) }, actor: Actor{Username: bob}},
		{name: "another pod labels it", edit: func(s *locksv1alpha1.LockSession) { s.Labels = entries(1) }, actor: podActor(alice, "p1")},
		{name: "owner adds a finalizer", edit: func(s *locksv1alpha1.LockSession) { s.Finalizers = []string{"x/y"} }, actor: podActor(alice, "p0")},
		{name: "owner drops its owner reference", edit: func(s *locksv1alpha1.LockSession) { s.OwnerReferences = nil }, actor: podActor(alice, "p0")},
		{name: "garbage collector orphans it", edit: func(s *locksv1alpha1.LockSession) { s.OwnerReferences = nil }, actor: Actor{Username: gcUser, IsGarbageCollector: true}, allowed: true},
		{name: "controller adds a finalizer", edit: func(s *locksv1alpha1.LockSession) { s.Finalizers = []string{"x/y"} }, actor: Actor{Username: ctrlr, IsController: true}},
	}
	for _, c := range cases {
		o := session("p0")
		n := o.DeepCopy()
		c.edit(n)
		wantRule(t, c.name, ValidateSessionUpdate(o, n, c.actor), c.allowed)
	}
}

func TestValidateSessionDelete(t *testing.T) {
	cases := []struct {
		name    string
		pod     string
		actor   Actor
		allowed bool
	}{
		{name: "owner closes", actor: Actor{Username: alice}, allowed: true},
		{name: "owner closes from its pod", pod: "p0", actor: podActor(alice, "p0"), allowed: true},
		{name: "another pod of the owner closes", pod: "p0", actor: podActor(alice, "p1")},
		{name: "another user closes", actor: Actor{Username: bob}},
		{name: "controller deletes a lapsed session", actor: Actor{Username: ctrlr, IsController: true}, allowed: true},
		{name: "garbage collector deletes it", pod: "p0", actor: Actor{Username: gcUser, IsGarbageCollector: true}, allowed: true},
		{name: "force-release", pod: "p0", actor: Actor{Username: bob, Authorizer: allow(locksv1alpha1.ForceReleaseVerb)}, allowed: true},
	}
	for _, c := range cases {
		wantRule(t, c.name, ValidateSessionDelete(session(c.pod), c.actor), c.allowed)
	}
}

func TestValidateSessionRefs(t *testing.T) {
	inSession := func(name, pod string) func(*locksv1alpha1.DistributedLock) {
		return func(l *locksv1alpha1.DistributedLock) {
			h := holder(alice, "l1", "r1")
			h.Session = name
			if pod != "" {
				h.PodName, h.PodUID = pod, uidOf(pod)
			}
			l.Acquire(h, 101)
		}
	}
	terminating := session("")
	terminating.DeletionTimestamp = &metav1.Time{Time: now.Time}
	bobs := session("")
	bobs.Spec.User = bob
	heldInSession := func() *locksv1alpha1.DistributedLock {
		l := free()
		inSession("s1", "")(l)
		l.ResourceVersion = "200"
		return l
	}
	cases := []struct {
		name     string
		old      *locksv1alpha1.DistributedLock
		edit     func(*locksv1alpha1.DistributedLock)
		actor    Actor
		sessions map[string]*locksv1alpha1.LockSession
		allowed  bool
	}{
		{name: "acquire in own session", old: free(), edit: inSession("s1", ""), actor: Actor{Username: alice},
			sessions: map[string]*locksv1alpha1.LockSession{"s1": session("")}, allowed: true},
		{name: "acquire in own pod's session", old: free(), edit: inSession("s1", "p0"), actor: podActor(alice, "p0"),
			sessions: map[string]*locksv1alpha1.LockSession{"s1": session("p0")}, allowed: true},
		{name: "acquire in a missing session", old: free(), edit: inSession("s1", ""), actor: Actor{Username: alice}},
		{name: "acquire in a terminating session", old: free(), edit: inSession("s1", ""), actor: Actor{Username: alice},
			sessions: map[string]*locksv1alpha1.LockSession{"s1": terminating}},
		{name: "acquire in another user's session", old: free(), edit: inSession("s1", ""), actor: Actor{Username: alice},
			sessions: map[string]*locksv1alpha1.LockSession{"s1": bobs}},
		{name: "acquire in another pod's session", old: free(), edit: inSession("s1", "p1"), actor: podActor(alice, "p1"),
			sessions: map[string]*locksv1alpha1.LockSession{"s1": session("p0")}},
		{name: "enqueue in another user's session", old: heldBy(bob), edit: func(l *locksv1alpha1.DistributedLock) {
			w := waiter(alice, "ra")
			w.Session = "s1"
			l.Status.AppendWaiter(w)
		}, actor: Actor{Username: alice}, sessions: map[string]*locksv1alpha1.LockSession{"s1": bobs}},
		{name: "enqueue in own session", old: heldBy(bob), edit: func(l *locksv1alpha1.DistributedLock) {
			w := waiter(alice, "ra")
			w.Session = "s1"
			l.Status.AppendWaiter(w)
		}, actor: Actor{Username: alice}, sessions: map[string]*locksv1alpha1.LockSession{"s1": session("")}, allowed: true},
		{name: "renew a holding in a session", old: heldInSession(), edit: renew, actor: Actor{Username: alice}},
		{name: "release a holding in a session", old: heldInSession(), edit: end(locksv1alpha1.EndReasonReleased, alice), actor: Actor{Username: alice}, allowed: true},
	}
	for _, c := range cases {
		n := c.old.DeepCopy()
		c.edit(n)
		errs := ValidateSessionRefs(c.old, n, c.actor, c.sessions)
		if c.allowed {
			errs = append(errs, ValidateStatusUpdate(c.old, n, c.actor)...)
		}
		wantRule(t, c.name, errs, c.allowed)
	}
}

func yes() *bool { b := true; return &b }

// TestSessionsNamedOnlyForAnAdmissibleShape: a write that adds more than one
// waiter or holding names no session to read, so a denied write costs no
// live read per entry (red team); one that adds one names its session.
func TestSessionsNamedOnlyForAnAdmissibleShape(t *testing.T) {
	old := heldBy(bob)
	inSession := func(n int) *locksv1alpha1.DistributedLock {
		l := old.DeepCopy()
		for i := range n {
			w := waiter(alice, fmt.Sprint("r", i))
			w.Session = fmt.Sprint("s", i)
			l.Status.AppendWaiter(w)
		}
		return l
	}
	if got := SessionsNamed(old, inSession(1)); !slices.Equal(got, []string{"s0"}) {
		t.Errorf("one waiter: SessionsNamed = %v, want [s0]", got)
	}
	if got := SessionsNamed(old, inSession(128)); len(got) > 0 {
		t.Errorf("128 waiters: SessionsNamed = %d names, want none", len(got))
	}
}
