package rules

import (
	"context"
	"strings"
	"testing"
	"unicode/utf8"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/test/policytest"
)

func TestPodFieldRules(t *testing.T) {
	byTokenOf := func(name, uid string) Actor {
		return Actor{Username: bob, Extra: map[string][]string{ExtraPodName: {name}, ExtraPodUID: {uid}}}
	}
	withPod := func(w locksv1alpha1.Waiter, name, uid string) locksv1alpha1.Waiter {
		w.PodName, w.PodUID = name, uid
		return w
	}
	acquireInPod := func(name, uid string) func(*locksv1alpha1.DistributedLock) {
		return func(l *locksv1alpha1.DistributedLock) {
			h := holder(bob, "l1", "r1")
			h.PodName, h.PodUID = name, uid
			l.Acquire(h, 101)
		}
	}
	const noPod = MsgNoPodToken
	runRuleCases(t, []ruleCase{
		// A token bound to no pod (kubectl create token, a CI token) writes no pod fields.
		{name: "a token bound to no pod enqueues with a sibling pod's name and UID", old: heldBy(alice, podWaiter(bob, "b0", "p0")),
			edit: appendW(podWaiter(bob, "b1", "p1")), actor: Actor{Username: bob}, rule: RulePodBinding, msg: `waiter.podName "p1" ` + noPod},
		{name: "a token bound to no pod enqueues with a UID only", old: heldBy(alice), edit: appendW(withPod(waiter(bob, "b1"), "", uidOf("p1"))),
			actor: Actor{Username: bob}, rule: RulePodBinding, msg: `waiter.podUID "` + uidOf("p1") + `" ` + noPod},
		{name: "a token bound to no pod enqueues with podName " + badPod, old: heldBy(alice), edit: appendW(withPod(waiter(bob, "b1"), badPod, "")),
			actor: Actor{Username: bob}, rule: RulePodBinding, msg: `waiter.podName "` + badPod + `" ` + noPod},
		{name: "a token bound to no pod acquires in a pod's name", old: free(), edit: acquireInPod("p0", uidOf("p0")),
			actor: Actor{Username: bob}, rule: RulePodBinding, msg: `holder.podName "p0" ` + noPod},
		{name: "a token bound to no pod enqueues without pod fields", old: heldBy(alice), edit: appendW(waiter(bob, "b1")), actor: Actor{Username: bob}},
		// Stored forms: what a bound token's extras say is written as is.
		{name: "a token whose pod name is no pod's name enqueues in it", old: heldBy(alice), edit: appendW(withPod(waiter(bob, "b1"), badPod, uidOf("p0"))),
			actor: byTokenOf(badPod, uidOf("p0")), rule: RulePodBinding, msg: `waiter.podName "` + badPod + `" ` + msgPodNameForm},
		{name: "a token whose pod UID is no pod's UID acquires in it", old: free(), edit: acquireInPod("p0", "uid-p0"),
			actor: byTokenOf("p0", "uid-p0"), rule: RulePodBinding, msg: `holder.podUID "uid-p0" ` + msgPodUIDForm},
		{name: "a token whose pod UID is upper case acquires in it", old: free(), edit: acquireInPod("p0", strings.ToUpper(uidOf("p0"))),
			actor: byTokenOf("p0", strings.ToUpper(uidOf("p0"))), rule: RulePodBinding, msg: `holder.podUID "` + strings.ToUpper(uidOf("p0")) + `" ` + msgPodUIDForm},
		{name: "a pod acquires in its own name", old: free(), edit: acquireInPod("p0", uidOf("p0")), actor: podActor(bob, "p0")},
	})
}

func TestSessionPodForm(t *testing.T) {
	s := session("p0")
	s.Spec.PodName, s.OwnerReferences[0].Name = badPod, badPod
	a := Actor{Username: alice, Extra: map[string][]string{ExtraPodName: {badPod}, ExtraPodUID: {uidOf("p0")}}}
	errs := ValidateSessionCreate(s, a)
	want := `[kubelock:pod-binding] spec.podName "` + badPod + `" ` + msgPodNameForm
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), want) {
		t.Fatalf("got %v, want only %q", errs, want)
	}
}

// FuzzPodForm holds the stored-form checks of both engines to the CRD's
// patterns: a new waiter's podName and podUID, written from a token that
// names them, are admitted by the webhook's rules, by the policy and by the
// CRD's podName and podUID schema alike.
func FuzzPodForm(f *testing.F) {
	for _, name := range []string{"", "worker-7d9f", "p0", badPod, "Worker-0", "a.b-c", "-a", "a..b", strings.Repeat("a", 253), strings.Repeat("a", 254)} {
		f.Add(name, uidOf("p0"))
	}
	for _, uid := range []string{"", "uid-p0", strings.ToUpper(uidOf("p0")), strings.ReplaceAll(uidOf("p0"), "-", ""), uidOf("p0") + "0", "{" + uidOf("p0") + "}"} {
		f.Add("p0", uid)
	}
	p, err := statusPolicy()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, name, uid string) {
		if !utf8.ValidString(name) || !utf8.ValidString(uid) {
			return // JSON, and so the apiserver, never carries one
		}
		old := heldBy(alice)
		next := old.DeepCopy()
		w := waiter(bob, "b1")
		w.PodName, w.PodUID = name, uid
		next.Status.AppendWaiter(w)
		a := Actor{Username: bob, Extra: map[string][]string{ExtraPodName: {name}, ExtraPodUID: {uid}}}
		crd := (name == "" || len(name) <= 253 && podNameRE.MatchString(name)) && (uid == "" || len(uid) <= 36 && podUIDRE.MatchString(uid))
		webhook := len(ValidateStatusUpdate(old, next, a)) == 0
		msg, _, err := p.Judge(context.Background(), old, next, policytest.Writer{Name: a.Username, Extra: a.Extra})
		if err != nil {
			t.Fatalf("policy: %v", err)
		}
		if webhook != crd || (msg == "") != crd {
			t.Fatalf("podName %q podUID %q: the CRD admits %v, the webhook %v, the policy %v (%s)", name, uid, crd, webhook, msg == "", msg)
		}
	})
}
