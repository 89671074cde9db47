package rules

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// The writers and locks of the rule tables.

const (
	alice = "alice"
	bob   = "bob"
	carol = "carol"
	ctrlr = "system:serviceaccount:kubelock-system:kubelock-controller-manager"
	rw    = locksv1alpha1.RWMutex
	sem   = locksv1alpha1.Semaphore
)

var (
	now = metav1.NewMicroTime(time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC))
	ctl = Actor{Username: ctrlr, IsController: true}
)

// later is now + d.
func later(d time.Duration) metav1.MicroTime { return metav1.NewMicroTime(now.Add(d)) }

// allow is an Authorizer that allows verbs and nothing else.
func allow(verbs ...string) Authorizer {
	return AuthorizerFunc(func(c Check) (bool, error) { return slices.Contains(verbs, c.Verb), nil })
}

// recorder is an Authorizer that answers as its inner one (nil allows
// nothing) and records the verbs it was asked about.
type recorder struct {
	inner Authorizer
	asked []string
}

func (r *recorder) Allowed(c Check) (bool, error) {
	r.asked = append(r.asked, c.Verb)
	if r.inner == nil {
		return false, nil
	}
	return r.inner.Allowed(c)
}

// recording is a with a recorder around its Authorizer.
func recording(a Actor) (Actor, *recorder) {
	r := &recorder{inner: a.Authorizer}
	a.Authorizer = r
	return a, r
}

// mayForce is a's answer for the force-release verb, as the oracles see it.
func mayForce(a Actor) bool {
	ok, _ := a.may(Check{Verb: locksv1alpha1.ForceReleaseVerb}, nil)
	return ok
}

func free() *locksv1alpha1.DistributedLock {
	return &locksv1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "l", ResourceVersion: "100"},
		Status:     locksv1alpha1.DistributedLockStatus{FencingToken: 50, Transitions: 3},
	}
}

func holder(user, lease, req string) locksv1alpha1.LockHolder {
	return locksv1alpha1.LockHolder{Identity: user + "-pod", User: user, LeaseID: lease, RequestID: req, LeaseDurationSeconds: 30, AcquireTime: now, RenewTime: &now}
}

func waiter(user, req string) locksv1alpha1.Waiter {
	return locksv1alpha1.Waiter{Identity: user + "-pod", User: user, RequestID: req, EnqueueTime: now, Deadline: metav1.NewMicroTime(now.Add(time.Minute))}
}

// heldBy returns a lock held by user with lease "lease-a", at resourceVersion 200.
func heldBy(user string, waiters ...locksv1alpha1.Waiter) *locksv1alpha1.DistributedLock {
	l := free()
	for _, w := range waiters {
		l.Status.AppendWaiter(w)
	}
	l.Acquire(holder(user, "lease-a", "req-a"), 101)
	l.ResourceVersion = "200"
	return l
}

func queued(ws ...locksv1alpha1.Waiter) *locksv1alpha1.DistributedLock {
	l := free()
	for _, w := range ws {
		l.Status.AppendWaiter(w)
	}
	return l
}

func released() *locksv1alpha1.DistributedLock {
	l := heldBy(alice)
	l.EndHolding(locksv1alpha1.EndReasonReleased, alice, now)
	return l
}

func renew(l *locksv1alpha1.DistributedLock) {
	t := metav1.NewMicroTime(now.Add(time.Second))
	l.Status.Holder.RenewTime = &t
}

func end(reason locksv1alpha1.EndReason, by string) func(*locksv1alpha1.DistributedLock) {
	return func(l *locksv1alpha1.DistributedLock) { l.EndHolding(reason, by, now) }
}

func podActor(user, pod string) Actor {
	return Actor{Username: user, Extra: map[string][]string{ExtraPodName: {pod}, ExtraPodUID: {uidOf(pod)}}}
}

func podWaiter(user, req, pod string) locksv1alpha1.Waiter {
	w := waiter(user, req)
	w.PodName, w.PodUID = pod, uidOf(pod)
	return w
}

func podHeld(user, pod string) *locksv1alpha1.DistributedLock {
	l := free()
	h := holder(user, "lease-a", "req-a")
	h.PodName, h.PodUID = pod, uidOf(pod)
	l.Acquire(h, 101)
	l.ResourceVersion = "200"
	return l
}

func terminating(l *locksv1alpha1.DistributedLock) *locksv1alpha1.DistributedLock {
	ts := metav1.NewTime(now.Time)
	l.DeletionTimestamp = &ts
	return l
}

func perUser(l *locksv1alpha1.DistributedLock, n int32) *locksv1alpha1.DistributedLock {
	l.Spec.MaxWaitersPerUser = &n
	return l
}

func appendW(ws ...locksv1alpha1.Waiter) func(*locksv1alpha1.DistributedLock) {
	return func(l *locksv1alpha1.DistributedLock) {
		for _, w := range ws {
			l.Status.AppendWaiter(w)
		}
	}
}

func acquireAs(user, lease, req string) func(*locksv1alpha1.DistributedLock) {
	return func(l *locksv1alpha1.DistributedLock) {
		token, _ := locksv1alpha1.NextFencingToken(l.ResourceVersion)
		l.Acquire(holder(user, lease, req), token)
	}
}

func generation(l *locksv1alpha1.DistributedLock, g int64) *locksv1alpha1.DistributedLock {
	l.Generation = g
	return l
}

func addCondition(typ string, status metav1.ConditionStatus, reason string) func(*locksv1alpha1.DistributedLock) {
	return func(l *locksv1alpha1.DistributedLock) {
		l.Status.Conditions = append(l.Status.Conditions, metav1.Condition{Type: typ, Status: status, Reason: reason, LastTransitionTime: metav1.NewTime(now.Time)})
	}
}

func deadlined(w locksv1alpha1.Waiter, d metav1.MicroTime) locksv1alpha1.Waiter {
	w.Deadline = d
	return w
}

func maxWaitOf(l *locksv1alpha1.DistributedLock, s int32) *locksv1alpha1.DistributedLock {
	l.Spec.MaxWaitSeconds = s
	return l
}

// managers gives l n managedFields entries.
func managers(l *locksv1alpha1.DistributedLock, n int) *locksv1alpha1.DistributedLock {
	for range n {
		addManager(l)
	}
	return l
}

// addManager adds one managedFields entry, as a server-side apply under a new fieldManager does.
func addManager(l *locksv1alpha1.DistributedLock) {
	l.ManagedFields = append(l.ManagedFields, metav1.ManagedFieldsEntry{
		Manager: "m" + strconv.Itoa(len(l.ManagedFields)), Operation: metav1.ManagedFieldsOperationApply, Subresource: "status",
	})
}

// typed is a free lock of type t (permits for a Semaphore) at resourceVersion 100.
func typed(t locksv1alpha1.LockType, permits int32) *locksv1alpha1.DistributedLock {
	l := free()
	l.Spec.Type = t
	if t == locksv1alpha1.Semaphore {
		l.Spec.Permits = &permits
	}
	return l
}

// reading gives l shared holdings by users on slots 0, 1, …, leases
// "lease-<user>", requests "req-<user>", and moves it to resourceVersion 200.
func reading(l *locksv1alpha1.DistributedLock, users ...string) *locksv1alpha1.DistributedLock {
	for i, u := range users {
		l.AcquireShared(holder(u, "lease-"+u, "req-"+u), int32(i), l.Status.FencingToken+1)
	}
	l.ResourceVersion = "200"
	return l
}

func withWaiters(l *locksv1alpha1.DistributedLock, ws ...locksv1alpha1.Waiter) *locksv1alpha1.DistributedLock {
	for _, w := range ws {
		l.Status.AppendWaiter(w)
	}
	return l
}

func sharedWaiter(user, req string) locksv1alpha1.Waiter {
	w := waiter(user, req)
	w.Mode = locksv1alpha1.Shared
	return w
}

// share acquires a shared holding for user on slot with the right token.
func share(user, lease, req string, slot int32) func(*locksv1alpha1.DistributedLock) {
	return func(l *locksv1alpha1.DistributedLock) {
		token, _ := locksv1alpha1.NextFencingToken(l.ResourceVersion)
		l.AcquireShared(holder(user, lease, req), slot, token)
	}
}

func endShared(lease string, reason locksv1alpha1.EndReason, by string) func(*locksv1alpha1.DistributedLock) {
	return func(l *locksv1alpha1.DistributedLock) { l.EndShared(lease, reason, by, now) }
}

func renewShared(lease string) func(*locksv1alpha1.DistributedLock) {
	return func(l *locksv1alpha1.DistributedLock) {
		i := l.Status.SharedIndex(lease)
		t := metav1.NewMicroTime(now.Add(time.Second))
		l.Status.SharedHolders[i].RenewTime = &t
	}
}

func edits(fns ...func(*locksv1alpha1.DistributedLock)) func(*locksv1alpha1.DistributedLock) {
	return func(l *locksv1alpha1.DistributedLock) {
		for _, fn := range fns {
			fn(l)
		}
	}
}

// ruleCase is one status write of a rule table: allowed, or denied by rule with msg.
type ruleCase struct {
	name  string
	old   *locksv1alpha1.DistributedLock
	edit  func(*locksv1alpha1.DistributedLock)
	actor Actor
	rule  Rule   // "" = allowed
	msg   string // part of the denial, when set
	// crd: the policy engine leaves this denial to the CRD's rules.
	crd bool
}

// runRuleCases checks each case with the rules, by exact message and with a
// rule on every error, and with the policy (expectPolicyAgrees).
func runRuleCases(t *testing.T, cases []ruleCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			next := tc.old.DeepCopy()
			tc.edit(next)
			errs := ValidateStatusUpdate(tc.old, next, tc.actor)
			defer func() { expectPolicyAgrees(t, tc.old, next, tc.actor, errs, tc.crd) }()
			if tc.rule == "" {
				if len(errs) > 0 {
					t.Fatalf("denied: %v", errs.ToAggregate())
				}
				return
			}
			want := "[kubelock:" + string(tc.rule) + "] " + tc.msg
			if !strings.Contains(errs.ToAggregate().Error(), want) {
				t.Fatalf("got %v, want a denial with %q", errs.ToAggregate(), want)
			}
			for _, e := range errs {
				if RuleOf(e) == "" {
					t.Fatalf("denial without a rule tag: %v", e)
				}
			}
		})
	}
}
