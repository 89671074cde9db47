package admission

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/rules"
)

// hostile is one malformed or malicious request: from a lock in state, the
// user named by is writes with do, and the apiserver must reject it with a
// message containing every string of want, leaving the lock untouched.
type hostile struct {
	state state
	// setup, if set, brings the built lock further with admitted writes
	// (states the table's users cannot express, such as pod-bound entries).
	setup func(ctx context.Context, key client.ObjectKey)
	by    string
	do    func(ctx context.Context, u *user, key client.ObjectKey) error
	want  []string
	// decoded, if set, is what the lock apiserver says instead: it decodes a
	// write into the Go types before any check, so a value they cannot hold
	// is refused by its decoder (nothing is stored either way).
	decoded []string
}

// wantOf is what engine e says to h.
func (h hostile) wantOf(e engine) []string {
	if e == engineLockAPI && h.decoded != nil {
		return h.decoded
	}
	return h.want
}

// goCannotParse is the lock apiserver's refusal of a patch whose result
// holds a time Go cannot parse: a 422 naming the patched object.
var goCannotParse = []string{"patch: Invalid value: ", "parsing time "}

// tag is the start of a denial message of an admission rule.
func tag(r rules.Rule) string { return "[kubelock:" + string(r) + "] " }

// update is a status update: read, change with fn, write.
func update(fns ...func(*locksv1alpha1.DistributedLock)) func(context.Context, *user, client.ObjectKey) error {
	return func(ctx context.Context, u *user, key client.ObjectKey) error {
		return write(ctx, u, key, func(l *locksv1alpha1.DistributedLock) {
			for _, fn := range fns {
				fn(l)
			}
		})
	}
}

// patch sends a raw patch of the status subresource.
func patch(pt types.PatchType, body any) func(context.Context, *user, client.ObjectKey) error {
	return func(ctx context.Context, u *user, key client.ObjectKey) error {
		data, err := json.Marshal(body)
		if err != nil {
			return err
		}
		l := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
		return u.c.Status().Patch(ctx, l, client.RawPatch(pt, data))
	}
}

// apply server-side applies status (force, field manager "<user>-apply").
func apply(status map[string]any) func(context.Context, *user, client.ObjectKey) error {
	return func(ctx context.Context, u *user, key client.ObjectKey) error {
		obj := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": locksv1alpha1.GroupVersion.String(),
			"kind":       "DistributedLock",
			"metadata":   map[string]any{"namespace": key.Namespace, "name": key.Name},
			"status":     status,
		}}
		return u.c.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(obj),
			client.FieldOwner(u.name+"-apply"), client.ForceOwnership)
	}
}

// holderJSON is holder(user, n) as a JSON object.
func holderJSON(user string, n int) map[string]any {
	b, err := json.Marshal(holder(user, n))
	if err != nil {
		panic(err)
	}
	m := map[string]any{}
	if err := json.Unmarshal(b, &m); err != nil {
		panic(err)
	}
	return m
}

func lastRecord(l *locksv1alpha1.DistributedLock) *locksv1alpha1.FinishedHolding {
	return &l.Status.RecentAcquisitions[len(l.Status.RecentAcquisitions)-1]
}

func tokenDelta(d int64) func(*locksv1alpha1.DistributedLock) {
	return func(l *locksv1alpha1.DistributedLock) { l.Status.FencingToken += d }
}

var (
	free        = state{}
	freeHistory = state{history: true}
	held        = state{holder: "alice"}
	heldHistory = state{history: true, holder: "alice"}
	heldQueue   = state{holder: "alice", waiters: []string{"bob", "carol"}}
	freeQueue   = state{waiters: []string{"bob", "carol"}}
)

// hostileEntries is the table; both engines run all of it.
func hostileEntries() []TableEntry {
	entries := []TableEntry{
		// --- only the holder renews or releases -------------------------------
		Entry("renew by another user", hostile{state: held, by: "bob", do: update(renew),
			want: []string{tag(rules.RuleHolderOnly) + `only the holder "alice" may renew lease ` + leaseID("alice", 1)}}),
		Entry("release by another user", hostile{state: held, by: "bob", do: update(end(locksv1alpha1.EndReasonReleased, "bob")),
			want: []string{tag(rules.RuleHolderOnly) + `only the holder "alice" may release lease ` + leaseID("alice", 1)}}),
		Entry("the controller renewing someone's lease", hostile{state: held, by: controllerUser, do: update(renew),
			want: []string{tag(rules.RuleHolderOnly) + `only the holder "alice" may renew`}}),
		Entry("JSON patch that releases in the holder's name", hostile{state: held, by: "bob",
			do: func(ctx context.Context, u *user, key client.ObjectKey) error {
				token := get(ctx, key).Status.FencingToken
				return patch(types.JSONPatchType, []map[string]any{
					{"op": "remove", "path": "/status/holder"},
					{"op": "replace", "path": "/status/holderCount", "value": 0},
					{"op": "add", "path": "/status/recentAcquisitions", "value": []map[string]any{{
						"requestID": requestID("alice", 1), "leaseID": leaseID("alice", 1), "identity": "alice", "fencingToken": token,
						"endTime": metav1.NowMicro(), "endReason": "Released", "endedBy": "alice",
					}}},
				})(ctx, u, key)
			},
			want: []string{tag(rules.RuleIdentity) + `endedBy must be the requesting user "bob", not "alice"`}}),

		// --- fencing tokens ------------------------------------------------------
		Entry("acquire with a token lower than allowed (the resourceVersion)", hostile{state: freeHistory, by: "bob",
			do:   update(acquire(holder("bob", 1)), tokenDelta(-1)),
			want: []string{tag(rules.RuleFencingToken) + "an acquisition's fencingToken must be the lock's resourceVersion + 1"}}),
		Entry("acquire with a token higher than allowed", hostile{state: freeHistory, by: "bob",
			do:   update(acquire(holder("bob", 1)), tokenDelta(+1)),
			want: []string{tag(rules.RuleFencingToken) + "an acquisition's fencingToken must be the lock's resourceVersion + 1"}}),
		Entry("acquire with a token lower than the current one", hostile{state: freeHistory, by: "bob",
			do:   update(func(l *locksv1alpha1.DistributedLock) { l.Acquire(holder("bob", 1), l.Status.FencingToken-1) }),
			want: []string{"fencingToken must not decrease"}}),

		// --- identity ------------------------------------------------------------
		Entry("acquire with a forged holder.user", hostile{state: free, by: "bob", do: update(acquire(holder("alice", 1))),
			want: []string{tag(rules.RuleIdentity) + `holder.user must be the requesting user "bob", not "alice"`}}),
		Entry("enqueue with a forged waiter user", hostile{state: held, by: "bob", do: update(enqueue(waiter("carol", 1))),
			want: []string{tag(rules.RuleIdentity) + `a waiter's user must be the requesting user "bob", not "carol"`}}),
		Entry("a pod's service account acquiring in another pod's name", hostile{state: free, by: podSA,
			do: update(acquire(func() locksv1alpha1.LockHolder {
				h := holder(podSA, 1)
				h.PodName = "worker-1"
				return h
			}())),
			want: []string{tag(rules.RulePodBinding) + `holder.podName "worker-1" is not the requesting pod "worker-0"`}}),
		Entry("release recorded as ended by someone else", hostile{state: held, by: "alice", do: update(end(locksv1alpha1.EndReasonReleased, "bob")),
			want: []string{tag(rules.RuleIdentity) + `endedBy must be the requesting user "alice", not "bob"`}}),

		// --- the wait queue -------------------------------------------------------
		Entry("acquire while not the queue head", hostile{state: freeQueue, by: "carol", do: update(acquire(holder("carol", 1))),
			want: []string{tag(rules.RuleQueueHead) + "only the head of the wait queue (requestID " + requestID("bob", 1) + ` of "bob") may acquire`}}),
		Entry("acquire with the head's requestID by another user", hostile{state: freeQueue, by: "carol",
			do: update(acquire(func() locksv1alpha1.LockHolder {
				h := holder("carol", 1)
				h.RequestID = requestID("bob", 1)
				return h
			}())),
			want: []string{tag(rules.RuleQueueHead) + "only the head of the wait queue (requestID " + requestID("bob", 1) + ` of "bob") may acquire; request ` +
				requestID("bob", 1) + ` of "carol" is not`}}),
		Entry("acquire by a stranger while others wait", hostile{state: freeQueue, by: "dave", do: update(acquire(holder("dave", 1))),
			want: []string{tag(rules.RuleQueueHead) + "only the head of the wait queue"}}),
		Entry("the head acquiring and dropping the next waiter", hostile{state: freeQueue, by: "bob",
			do: update(func(l *locksv1alpha1.DistributedLock) {
				h := holder("bob", 1)
				l.Status.RemoveWaiter(requestID("carol", 1))
				acquire(h)(l)
			}),
			want: []string{tag(rules.RuleQueue) + `"bob" may remove only its own queue entries, not ` + requestID("carol", 1) + " (user carol)"}}),
		Entry("a waiter removing another waiter", hostile{state: heldQueue, by: "carol",
			do:   update(func(l *locksv1alpha1.DistributedLock) { l.Status.RemoveWaiter(requestID("bob", 1)) }),
			want: []string{tag(rules.RuleQueue) + `"carol" may remove only its own queue entries, not ` + requestID("bob", 1)}}),
		Entry("a waiter inserted not at the tail", hostile{state: heldQueue, by: "dave",
			do: update(func(l *locksv1alpha1.DistributedLock) {
				l.Status.Waiters = append([]locksv1alpha1.Waiter{waiter("dave", 1)}, l.Status.Waiters...)
				l.Status.WaiterCount++
			}),
			want: []string{tag(rules.RuleQueue) + "waiters join only at the tail and keep their order"}}),
		Entry("reordering the queue", hostile{state: heldQueue, by: "carol",
			do: update(func(l *locksv1alpha1.DistributedLock) {
				w := l.Status.Waiters
				w[0], w[1] = w[1], w[0]
			}),
			want: []string{tag(rules.RuleQueue) + "waiters join only at the tail and keep their order"}}),
		Entry("a waiter rewriting its queue entry", hostile{state: heldQueue, by: "bob",
			do: update(func(l *locksv1alpha1.DistributedLock) {
				l.Status.Waiters[0].Deadline = metav1.NewMicroTime(l.Status.Waiters[0].Deadline.Add(time.Hour))
			}),
			want: []string{tag(rules.RuleQueue) + "queue entry " + requestID("bob", 1) + " cannot change"}}),
		Entry("a queue beyond spec.maxWaiters", hostile{
			state: state{spec: locksv1alpha1.DistributedLockSpec{MaxWaiters: int32p(2)}, holder: "alice", waiters: []string{"bob", "carol"}},
			by:    "dave", do: update(enqueue(waiter("dave", 1))),
			want: []string{"the wait queue must not be longer than spec.maxWaiters"}}),
		Entry("enqueue where nobody may wait (maxWaiters 0)", hostile{
			state: state{spec: locksv1alpha1.DistributedLockSpec{MaxWaiters: int32p(0)}, holder: "alice"},
			by:    "bob", do: update(enqueue(waiter("bob", 1))),
			want: []string{"the wait queue must not be longer than spec.maxWaiters"}}),

		// --- malformed holdings -----------------------------------------------------
		Entry("identity over the length limit", hostile{state: free, by: "bob",
			do: update(acquire(func() locksv1alpha1.LockHolder {
				h := holder("bob", 1)
				h.Identity = strings.Repeat("b", 254)
				return h
			}())),
			want: []string{"status.holder.identity: Too long: may not be more than 253 bytes"}}),
		Entry("a negative lease", hostile{state: free, by: "bob", do: update(acquire(leaseOf("bob", -5))),
			want: []string{"holder.leaseDurationSeconds in body should be greater than or equal to 1"}}),
		Entry("a zero lease", hostile{state: free, by: "bob", do: update(acquire(leaseOf("bob", 0))),
			want: []string{"holder.leaseDurationSeconds in body should be greater than or equal to 1"}}),
		Entry("a huge lease", hostile{state: free, by: "bob", do: update(acquire(leaseOf("bob", 86400))),
			want: []string{"holder.leaseDurationSeconds in body should be less than or equal to 3600"}}),
		Entry("a lease above spec.maxLeaseDurationSeconds", hostile{state: free, by: "bob", do: update(acquire(leaseOf("bob", 1000))),
			want: []string{"holder.leaseDurationSeconds must not exceed spec.maxLeaseDurationSeconds"}}),
		Entry("changing holder.leaseDurationSeconds while held", hostile{state: held, by: "alice",
			do:   update(renew, func(l *locksv1alpha1.DistributedLock) { l.Status.Holder.LeaseDurationSeconds = 60 }),
			want: []string{tag(rules.RuleHolderFields) + "while lease " + leaseID("alice", 1) + " is held only holder.renewTime may change"}}),
		Entry("adding holder.podName while held", hostile{state: held, by: "alice",
			do:   update(func(l *locksv1alpha1.DistributedLock) { l.Status.Holder.PodName = "elsewhere" }),
			want: []string{tag(rules.RuleHolderFields) + "while lease " + leaseID("alice", 1) + " is held only holder.renewTime may change"}}),

		// --- ending a holding --------------------------------------------------------
		Entry("an unknown endReason", hostile{state: held, by: "alice", do: update(end("Stolen", "alice")),
			want: []string{`endReason: Unsupported value: "Stolen": supported values: "Released", "Expired", "ForceReleased"`}}),
		Entry("release with a wrong record", hostile{state: held, by: "alice",
			do: update(end(locksv1alpha1.EndReasonReleased, "alice"), func(l *locksv1alpha1.DistributedLock) {
				lastRecord(l).FencingToken++
			}),
			want: []string{tag(rules.RuleEndRecord) + "the record must describe the ending holding: leaseID " + leaseID("alice", 1)}}),
		Entry("release appending two records", hostile{state: held, by: "alice",
			do: update(end(locksv1alpha1.EndReasonReleased, "alice"), func(l *locksv1alpha1.DistributedLock) {
				l.Status.RecentAcquisitions = append(l.Status.RecentAcquisitions, *lastRecord(l))
			}),
			want: []string{tag(rules.RuleEndRecord) + "ending the holding of lease " + leaseID("alice", 1) + " must append exactly its record"}}),
		Entry("release that rewrites an earlier record", hostile{state: heldHistory, by: "alice",
			do: update(end(locksv1alpha1.EndReasonReleased, "alice"), func(l *locksv1alpha1.DistributedLock) {
				l.Status.RecentAcquisitions[0].EndReason = locksv1alpha1.EndReasonExpired
			}),
			want: []string{tag(rules.RuleEndRecord) + "ending a holding must keep the earlier records of recentAcquisitions unchanged"}}),
		Entry("expiry by a non-controller", hostile{state: held, by: "bob", do: update(end(locksv1alpha1.EndReasonExpired, "bob")),
			want: []string{tag(rules.RuleControllerOnly) + `only the kubelock controller may expire a lease; "bob" is not the controller`}}),
		Entry("the holder marking its own lease expired", hostile{state: held, by: "alice", do: update(end(locksv1alpha1.EndReasonExpired, "alice")),
			want: []string{tag(rules.RuleControllerOnly) + `only the kubelock controller may expire a lease; "alice" is not the controller`}}),
		Entry("force-release without the verb", hostile{state: held, by: "bob", do: update(end(locksv1alpha1.EndReasonForceReleased, "bob")),
			want: []string{tag(rules.RuleForceRelease) + `user "bob" may not force-release: it needs the "force-release" verb`}}),

		// --- the controller ----------------------------------------------------------
		Entry("the controller acquiring", hostile{state: free, by: controllerUser, do: update(acquire(holder(controllerUser, 1))),
			want: []string{tag(rules.RuleControllerOnly) + "the controller may expire holdings but never acquire a lock"}}),
		Entry("the controller enqueuing", hostile{state: held, by: controllerUser, do: update(enqueue(waiter(controllerUser, 1))),
			want: []string{tag(rules.RuleControllerOnly) + "the controller may drop waiters but never enqueue"}}),

		// --- history -----------------------------------------------------------------
		Entry("a merge patch that drops recentAcquisitions", hostile{state: freeHistory, by: "alice",
			do:   patch(types.MergePatchType, map[string]any{"status": map[string]any{"recentAcquisitions": nil}}),
			want: []string{tag(rules.RuleHistory) + "recentAcquisitions changes only when a holding ends"}}),
		Entry("a JSON patch that rewrites history", hostile{state: freeHistory, by: "bob",
			do:   patch(types.JSONPatchType, []map[string]any{{"op": "replace", "path": "/status/recentAcquisitions/0/endedBy", "value": "bob"}}),
			want: []string{tag(rules.RuleHistory) + "recentAcquisitions changes only when a holding ends"}}),

		// --- server-side apply --------------------------------------------------------
		Entry("server-side apply that renews someone else's lease", hostile{state: held, by: "bob",
			do: apply(map[string]any{"holder": map[string]any{
				"user": "alice", "leaseID": leaseID("alice", 1), "renewTime": metav1.NewMicroTime(time.Now().Add(time.Hour)),
			}}),
			want: []string{tag(rules.RuleHolderOnly) + `only the holder "alice" may renew lease ` + leaseID("alice", 1)}}),

		// --- deletion ----------------------------------------------------------------
		Entry("deleting a held lock", hostile{state: held, by: "deleter",
			do: func(ctx context.Context, u *user, key client.ObjectKey) error {
				return u.c.Delete(ctx, &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}})
			},
			want: []string{tag(rules.RuleHeldDelete) + "lock ", " is held by alice (lease " + leaseID("alice", 1) + "); release it first"}}),
	}
	entries = append(entries, sharedHostileEntries()...)
	entries = append(entries, redteamSharedEntries()...)
	entries = append(entries, movedEntries()...)
	entries = append(entries, redteam3Entries()...)
	return append(entries, statusHostileEntries()...)
}

// leaseOf is user's holding asking for a lease of seconds.
func leaseOf(user string, seconds int32) locksv1alpha1.LockHolder {
	h := holder(user, 1)
	h.LeaseDurationSeconds = seconds
	return h
}

// --- the status rules: what a lock user may write in status -------------------------

// otherPod names podSA's token bound to another pod, worker-1: the same user
// as podUser, another holder.
const otherPod = podSA + "@worker-1"

// Pod-bound tokens of podSA as the suite impersonates them (the pods'
// UIDs are the apiserver's form; no pod has them).
const (
	pod0Name, pod0UID = "worker-0", "5f0c3a9e-1b2d-4c6e-8f70-9a1b2c3d4e5f"
	pod1Name, pod1UID = "worker-1", "6e1d4b0f-2c3e-4d7f-9081-ab2c3d4e5f60"
)

// otherPodUser is podSA bound to worker-1 (setUpUsers makes it when first used).
var otherPodUser func() *user

// badPod names podSA with impersonated pod extras that are no pod's name
// and UID (a real token's never are).
const (
	badPod                = podSA + "@bad-pod"
	badPodName, badPodUID = "../../../../../version", "uid-worker-0"
)

var badPodUser func() *user

// unboundPod names podSA with a token bound to no pod (no pod extra).
const unboundPod = podSA + "@no-pod"

var unboundPodUser func() *user

// impersonatedPod is podSA with a token bound to the pod name and uid, as
// the suite impersonates one; with neither, a token bound to no pod.
func impersonatedPod(name, uid string) *user {
	imp := rest.CopyConfig(env.Config)
	imp.QPS = -1
	imp.Impersonate = rest.ImpersonationConfig{UserName: podSA}
	if name != "" || uid != "" {
		imp.Impersonate.Extra = map[string][]string{rules.ExtraPodName: {name}, rules.ExtraPodUID: {uid}}
	}
	return &user{name: podSA, c: newClient(imp), cfg: imp}
}

// actor is who of the table's users, and podSA's other tokens.
func actor(by string) *user {
	switch by {
	case otherPod:
		return otherPodUser()
	case unboundPod:
		return unboundPodUser()
	case badPod:
		return badPodUser()
	}
	return who(by)
}

// podHolder is podSA's holding from the pod name/uid.
func podHolder(n int, name, uid string) locksv1alpha1.LockHolder {
	h := holder(podSA, n)
	h.Identity, h.PodName, h.PodUID = name, name, uid
	return h
}

// podWaiter is podSA's queue entry n from the pod name/uid.
func podWaiter(n int, name, uid string) locksv1alpha1.Waiter {
	w := waiter(podSA, n)
	w.Identity, w.PodName, w.PodUID = name, name, uid
	return w
}

// forgeSibling: a token of a real service account bound to no pod (kubectl
// create token) queues for the lock at key in the name and UID of a real pod
// of that account, whose own bound token is elsewhere.
func forgeSibling(ctx context.Context, _ *user, key client.ObjectKey) error {
	pods, sa := podsOf(ctx, key.Namespace, 2)
	u, sibling := unboundTokenUser(ctx, sa), pods[1].pod
	w := waiter(u.name, 1)
	w.PodName, w.PodUID = sibling.Name, string(sibling.UID)
	return write(ctx, u, key, enqueue(w))
}

// podHolds: worker-0 acquires the lock (holding number 1).
func podHolds(ctx context.Context, key client.ObjectKey) {
	Expect(write(ctx, podUser, key, acquire(podHolder(1, pod0Name, pod0UID)))).To(Succeed())
}

// podWaits: worker-0 queues (request number 1).
func podWaits(ctx context.Context, key client.ObjectKey) {
	Expect(write(ctx, podUser, key, enqueue(podWaiter(1, pod0Name, pod0UID)))).To(Succeed())
}

// fills: u queues n entries, one per write, request numbers 1..n.
func fills(name string, n int) func(context.Context, client.ObjectKey) {
	return func(ctx context.Context, key client.ObjectKey) {
		for i := 1; i <= n; i++ {
			Expect(write(ctx, who(name), key, enqueue(waiter(name, i)))).To(Succeed())
		}
	}
}

// terminates: the administrator puts a finalizer on the lock and deletes it,
// so it stays, Terminating, with a deletionTimestamp.
func terminates(ctx context.Context, key client.ObjectKey) {
	l := get(ctx, key)
	l.Finalizers = append(l.Finalizers, "locks.kubelock.io/test-keep")
	Expect(env.Client.Update(ctx, l)).To(Succeed())
	Expect(env.Client.Delete(ctx, l)).To(Succeed())
	Expect(get(ctx, key).DeletionTimestamp).NotTo(BeNil())
}

// addWaiterRaw appends a queue entry given as JSON (times as raw strings) with
// a JSON patch, keeping waiterCount in step.
func addWaiterRaw(w map[string]any) func(context.Context, *user, client.ObjectKey) error {
	return func(ctx context.Context, u *user, key client.ObjectKey) error {
		n := len(get(ctx, key).Status.Waiters)
		return patch(types.JSONPatchType, appendWaiterOps(n, w))(ctx, u, key)
	}
}

// appendWaiterOps are JSON patch operations that append w to a queue of n
// entries (an empty queue is absent from the stored object).
func appendWaiterOps(n int, w any) []map[string]any {
	add := map[string]any{"op": "add", "path": "/status/waiters/-", "value": w}
	if n == 0 {
		add = map[string]any{"op": "add", "path": "/status/waiters", "value": []any{w}}
	}
	return []map[string]any{add, {"op": "replace", "path": "/status/waiterCount", "value": n + 1}}
}

// rawWaiter is waiter(user, n) as JSON with its times replaced by enqueue and deadline.
func rawWaiter(user string, n int, enqueue, deadline string) map[string]any {
	return map[string]any{
		"identity": user, "user": user, "requestID": requestID(user, n),
		"enqueueTime": enqueue, "deadline": deadline,
	}
}

// rawTime is a MicroTime's JSON string a minute from now.
func rawTime(d time.Duration) string {
	return metav1.NewMicroTime(time.Now().Add(d)).UTC().Format("2006-01-02T15:04:05.000000Z07:00")
}

// setConditions replaces status.conditions with a JSON merge patch (times as raw strings).
func setConditions(conds ...map[string]any) func(context.Context, *user, client.ObjectKey) error {
	return patch(types.MergePatchType, map[string]any{"status": map[string]any{"conditions": conds}})
}

// heldCond is a Held condition as JSON, observedGeneration 1 (locks here keep their first generation).
func heldCond(status, reason, transition string) map[string]any {
	return map[string]any{
		"type": locksv1alpha1.ConditionHeld, "status": status, "reason": reason, "message": "set by hand",
		"observedGeneration": 1, "lastTransitionTime": transition,
	}
}

// nowRFC3339 is the current time as metav1.Time writes it.
func nowRFC3339() string { return time.Now().UTC().Format(time.RFC3339) }

// waiterWait is user's entry n enqueued now with a deadline d later.
func waiterWait(user string, n int, d time.Duration) locksv1alpha1.Waiter {
	w := waiter(user, n)
	w.Deadline = metav1.NewMicroTime(w.EnqueueTime.Add(d))
	return w
}

// The fixed messages of the status rules, as both engines give them (copied
// here, so a change in either engine shows up as a failing case).
const (
	msgObservedGeneration = "a lock user may leave status.observedGeneration unchanged or set it to metadata.generation, nothing else"
	msgConditions         = "a lock user may leave status.conditions unchanged or set them to exactly one Held condition: status True if the lock has any holding (holder or shared holders) and False if not, observedGeneration equal to metadata.generation, reason Acquired, Released, Expired, ForceReleased or NeverHeld, a printable message of at most 256 characters"
	msgConditionsInStep   = "a write that acquires or ends a holding must set status.conditions to exactly one Held condition in step with it (True while any holding remains, False when none does)"
	msgTime               = "every status.conditions[].lastTransitionTime must be an RFC 3339 time that Go parses, such as 2026-01-02T15:04:05Z"
	msgOneWaiterPerWrite  = "one write may add at most one waiter to the queue"
	msgWaitersPerUser     = "a user may have at most min(spec.maxWaitersPerUser, spec.maxWaiters) entries in the wait queue"
	msgWaitersPerPod      = "a pod may have at most one entry in the wait queue"
	msgWaitBound          = "a new waiter's deadline must be after its enqueueTime and at most spec.maxWaitSeconds after it"
	msgPodHolding         = "a holding bound to a pod is renewed or released only by its user from that same pod (holder.podUID)"
	msgPodWaiter          = "a queue entry bound to a pod leaves the queue only from that same pod (waiters[].podUID) or by the controller"
	msgLeaseID            = "an acquisition needs a fresh leaseID: it must differ from the current holder's, from every shared holder's and from every leaseID in status.recentAcquisitions"
	msgTerminating        = "the lock is being deleted (metadata.deletionTimestamp is set): it cannot be acquired and nobody may join its queue"
)

func statusHostileEntries() []TableEntry {
	bookkeeping, timeFormat := tag(rules.RuleBookkeeping), tag(rules.RuleTimeFormat)
	queue, waitBound, podBinding := tag(rules.RuleQueue), tag(rules.RuleWaitBound), tag(rules.RulePodBinding)
	leaseIDTag, terminating := tag(rules.RuleLeaseID), tag(rules.RuleTerminating)
	identityPattern := "in body should match '" + locksv1alpha1.IdentityPattern + "'"
	podNamePattern := "in body should match '" + locksv1alpha1.PodNamePattern + "'"
	podUIDPattern := "in body should match '" + locksv1alpha1.PodUIDPattern + "'"
	noPodToken := rules.MsgNoPodToken
	microPattern := "in body should match '" + locksv1alpha1.MicroTimePattern + "'"
	return []TableEntry{
		// --- class 2: bookkeeping cannot be forged --------------------------------
		Entry("eight foreign conditions (the CRD's bound) on someone's held lock", hostile{state: held, by: "bob",
			do: setConditions(func() []map[string]any {
				var cs []map[string]any
				for i := range locksv1alpha1.MaxConditions {
					cs = append(cs, map[string]any{"type": fmt.Sprintf("Squat%d", i), "status": "True", "reason": "Squatting",
						"message": "full", "lastTransitionTime": nowRFC3339()})
				}
				return cs
			}()...),
			want: []string{bookkeeping + msgConditions}}),
		Entry("one foreign condition next to Held", hostile{state: held, by: "alice",
			do: setConditions(heldCond("True", locksv1alpha1.ReasonAcquired, nowRFC3339()),
				map[string]any{"type": "Extra", "status": "True", "reason": "Mine", "message": "", "lastTransitionTime": nowRFC3339()}),
			want: []string{bookkeeping + msgConditions}}),
		Entry("a Held condition with a wrong status (False while held)", hostile{state: held, by: "bob",
			do:   setConditions(heldCond("False", locksv1alpha1.ReasonReleased, nowRFC3339())),
			want: []string{bookkeeping + msgConditions}}),
		Entry("a Held condition with an unknown reason", hostile{state: held, by: "alice",
			do:   setConditions(heldCond("True", "Stolen", nowRFC3339())),
			want: []string{bookkeeping + msgConditions}}),
		Entry("a Held condition for another generation", hostile{state: held, by: "alice",
			do: setConditions(func() map[string]any {
				c := heldCond("True", locksv1alpha1.ReasonAcquired, nowRFC3339())
				c["observedGeneration"] = 99
				return c
			}()),
			want: []string{bookkeeping + msgConditions}}),
		Entry("a Held condition with a message over 256 characters", hostile{state: held, by: "alice",
			do: setConditions(func() map[string]any {
				c := heldCond("True", locksv1alpha1.ReasonAcquired, nowRFC3339())
				c["message"] = strings.Repeat("m", locksv1alpha1.MaxConditionMessage+1)
				return c
			}()),
			want: []string{crdConditionMessage}}),
		Entry("a Held condition whose message carries a terminal escape and U+202E", hostile{state: held, by: "alice",
			do: setConditions(func() map[string]any {
				c := heldCond("True", locksv1alpha1.ReasonAcquired, nowRFC3339())
				c["message"] = "held by \x1b[2J\u202eroot"
				return c
			}()),
			want: []string{bookkeeping + msgConditions}}),
		Entry("status.observedGeneration 99", hostile{state: held, by: "bob",
			do:   patch(types.MergePatchType, map[string]any{"status": map[string]any{"observedGeneration": 99}}),
			want: []string{bookkeeping + msgObservedGeneration}}),
		Entry("acquire without writing the Held condition", hostile{state: free, by: "bob",
			do:   update(acquire(holder("bob", 1)), func(l *locksv1alpha1.DistributedLock) { l.Status.Conditions = nil }),
			want: []string{bookkeeping + msgConditionsInStep}}),
		Entry("release that leaves Held True", hostile{state: held, by: "alice",
			do: update(end(locksv1alpha1.EndReasonReleased, "alice"), func(l *locksv1alpha1.DistributedLock) {
				l.Status.Conditions[0].Status = metav1.ConditionTrue
				l.Status.Conditions[0].Reason = locksv1alpha1.ReasonAcquired
			}),
			want: []string{bookkeeping + msgConditions}}),

		// --- class 1: times Go cannot parse ---------------------------------------------
		Entry("a Held condition whose lastTransitionTime has a lower-case t", hostile{state: held, by: "alice",
			do:   setConditions(heldCond("True", locksv1alpha1.ReasonAcquired, strings.Replace(nowRFC3339(), "T", "t", 1))),
			want: []string{timeFormat + msgTime}, decoded: goCannotParse}),
		Entry("a Held condition whose lastTransitionTime has a lower-case z", hostile{state: held, by: "alice",
			do:   setConditions(heldCond("True", locksv1alpha1.ReasonAcquired, strings.Replace(nowRFC3339(), "Z", "z", 1))),
			want: []string{timeFormat + msgTime}, decoded: goCannotParse}),
		Entry("a Held condition whose lastTransitionTime has a space for the decimal point", hostile{state: held, by: "alice",
			do:   setConditions(heldCond("True", locksv1alpha1.ReasonAcquired, strings.Replace(nowRFC3339(), "Z", " 5Z", 1))),
			want: []string{timeFormat + msgTime}, decoded: goCannotParse}),
		Entry("the controller writing a condition whose lastTransitionTime has a lower-case t", hostile{state: held, by: controllerUser,
			do: setConditions(heldCond("True", locksv1alpha1.ReasonAcquired, nowRFC3339()),
				map[string]any{"type": "Stale", "status": "False", "reason": "Checked", "message": "", "lastTransitionTime": strings.Replace(nowRFC3339(), "T", "t", 1)}),
			want: []string{timeFormat + msgTime}, decoded: goCannotParse}),
		Entry("a Held condition whose lastTransitionTime has no zone", hostile{state: held, by: "alice",
			do:   setConditions(heldCond("True", locksv1alpha1.ReasonAcquired, strings.TrimSuffix(nowRFC3339(), "Z"))),
			want: []string{"lastTransitionTime in body must be of type date-time"}, decoded: goCannotParse}),
		Entry("a waiter enqueueTime without microseconds", hostile{state: held, by: "bob",
			do:   addWaiterRaw(rawWaiter("bob", 1, nowRFC3339(), rawTime(time.Minute))),
			want: []string{"enqueueTime " + microPattern}, decoded: goCannotParse}),
		Entry("a waiter enqueueTime with a lower-case z", hostile{state: held, by: "bob",
			do:   addWaiterRaw(rawWaiter("bob", 1, strings.Replace(rawTime(0), "Z", "z", 1), rawTime(time.Minute))),
			want: []string{"enqueueTime " + microPattern}, decoded: goCannotParse}),
		Entry("a waiter deadline without a zone", hostile{state: held, by: "bob",
			do:   addWaiterRaw(rawWaiter("bob", 1, rawTime(0), strings.TrimSuffix(rawTime(time.Minute), "Z"))),
			want: []string{"deadline " + microPattern}, decoded: goCannotParse}),

		// --- class 3: one user fills the queue ----------------------------------------------
		Entry("two waiters in one write", hostile{state: held, by: "bob",
			do:   update(enqueue(waiter("bob", 1)), enqueue(waiter("bob", 2))),
			want: []string{queue + msgOneWaiterPerWrite}}),
		Entry("a 17th waiter of one user (spec.maxWaitersPerUser 16)", hostile{state: held, setup: fills("bob", 16), by: "bob",
			do:   update(enqueue(waiter("bob", 17))),
			want: []string{queue + msgWaitersPerUser}}),
		Entry("a second waiter of one user where spec.maxWaitersPerUser is 1", hostile{
			state: state{spec: locksv1alpha1.DistributedLockSpec{MaxWaitersPerUser: int32p(1)}, holder: "alice", waiters: []string{"bob"}},
			by:    "bob", do: update(enqueue(waiter("bob", 2))),
			want: []string{queue + msgWaitersPerUser}}),
		Entry("a second entry of the same pod", hostile{state: held, setup: podWaits, by: podSA,
			do:   update(enqueue(podWaiter(2, pod0Name, pod0UID))),
			want: []string{queue + msgWaitersPerPod}}),
		Entry("a deadline in 2099", hostile{state: held, by: "bob",
			do: update(enqueue(func() locksv1alpha1.Waiter {
				w := waiter("bob", 1)
				w.Deadline = metav1.NewMicroTime(time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC))
				return w
			}())),
			want: []string{waitBound + msgWaitBound}}),
		Entry("a deadline one second beyond spec.maxWaitSeconds", hostile{
			state: state{spec: locksv1alpha1.DistributedLockSpec{MaxWaitSeconds: 60}, holder: "alice"},
			by:    "bob", do: update(enqueue(waiterWait("bob", 1, 61*time.Second))),
			want: []string{waitBound + msgWaitBound}}),
		Entry("a deadline before enqueueTime", hostile{state: held, by: "bob",
			do:   update(enqueue(waiterWait("bob", 1, -time.Minute))),
			want: []string{waitBound + msgWaitBound}}),
		Entry("a deadline equal to enqueueTime", hostile{state: held, by: "bob",
			do:   update(enqueue(waiterWait("bob", 1, 0))),
			want: []string{waitBound + msgWaitBound}}),

		// --- class 7: pod binding on every write ------------------------------------------
		Entry("renew from another pod of the same service account", hostile{state: free, setup: podHolds, by: otherPod,
			do:   update(renew),
			want: []string{podBinding + msgPodHolding}}),
		Entry("release from another pod of the same service account", hostile{state: free, setup: podHolds, by: otherPod,
			do:   update(end(locksv1alpha1.EndReasonReleased, podSA)),
			want: []string{podBinding + msgPodHolding}}),
		Entry("leaving another pod's queue entry", hostile{state: held, setup: podWaits, by: otherPod,
			do:   update(removeWaiter(requestID(podSA, 1))),
			want: []string{podBinding + msgPodWaiter}}),
		Entry("renewing a pod's holding with a token bound to no pod", hostile{state: free, setup: podHolds, by: unboundPod,
			do:   update(renew),
			want: []string{podBinding + msgPodHolding}}),
		Entry("a pod queueing without naming its pod", hostile{state: held, by: podSA,
			do:   update(enqueue(waiter(podSA, 1))),
			want: []string{podBinding + `waiter.podName "" is not the requesting pod "worker-0"`}}),
		Entry("a pod acquiring without naming its pod", hostile{state: free, by: podSA,
			do:   update(acquire(holder(podSA, 1))),
			want: []string{podBinding + `holder.podName "" is not the requesting pod "worker-0"`}}),
		Entry("a pod queueing in another pod's name", hostile{state: held, by: otherPod,
			do:   update(enqueue(podWaiter(1, pod0Name, pod0UID))),
			want: []string{podBinding + `waiter.podName "worker-0" is not the requesting pod "worker-1"`}}),
		Entry("the other pod acquiring as the head with the head's requestID", hostile{state: free, setup: podWaits, by: otherPod,
			do:   update(acquire(podHolder(1, pod1Name, pod1UID))),
			want: []string{podBinding + msgPodWaiter}}),

		// --- pod fields only from that pod's bound token --------------------------------------
		// A token of the pods' service account bound to no pod (kubectl create
		// token, a CI token) put a sibling's name and UID in the queue (the pod
		// was then refused as having an entry already) or a podName that made
		// the controller's read of the pod another URL (its reconcile of the
		// lock failed every time).
		Entry("a token bound to no pod queueing in a sibling pod's name and UID", hostile{state: held, by: unboundPod,
			do:   update(enqueue(podWaiter(1, pod1Name, pod1UID))),
			want: []string{podBinding + `waiter.podName "` + pod1Name + `" ` + noPodToken}}),
		Entry("a token bound to no pod queueing with a pod's UID only", hostile{state: held, by: unboundPod,
			do: update(enqueue(func() locksv1alpha1.Waiter {
				w := waiter(podSA, 1)
				w.PodUID = pod1UID
				return w
			}())),
			want: []string{podBinding + `waiter.podUID "` + pod1UID + `" ` + noPodToken}}),
		Entry("a token bound to no pod acquiring in a pod's name and UID", hostile{state: free, by: unboundPod,
			do:   update(acquire(podHolder(1, pod0Name, pod0UID))),
			want: []string{podBinding + `holder.podName "` + pod0Name + `" ` + noPodToken}}),
		Entry("a token bound to no pod taking a permit in a pod's name and UID", hostile{state: state{spec: sem3Spec}, by: unboundPod,
			do:   update(acquireShared(podHolder(1, pod0Name, pod0UID), 0)),
			want: []string{podBinding + `sharedHolder.podName "` + pod0Name + `" ` + noPodToken}}),
		Entry("a certificate user queueing in a pod's name", hostile{state: held, by: "bob",
			do: update(enqueue(func() locksv1alpha1.Waiter {
				w := waiter("bob", 1)
				w.PodName = pod0Name
				return w
			}())),
			want: []string{podBinding + `waiter.podName "` + pod0Name + `" ` + noPodToken}}),
		Entry("a token of the pods' account bound to no pod queueing in a real sibling pod's name and UID", hostile{state: held, by: "bob",
			do:   forgeSibling,
			want: []string{podBinding + `waiter.podName "worker-`, `" ` + noPodToken}}),
		Entry("a token bound to no pod queueing with podName ../../../../../version", hostile{state: held, by: unboundPod,
			do:   update(enqueue(podWaiter(1, "../../../../../version", ""))),
			want: []string{"podName " + podNamePattern}}),
		Entry("a token whose pod extras are no pod's name and UID queueing in their name", hostile{state: held, by: badPod,
			do:   update(enqueue(podWaiter(1, badPodName, badPodUID))),
			want: []string{"podName " + podNamePattern, "podUID " + podUIDPattern}}),

		// --- class 8: lease IDs are fresh -----------------------------------------------------
		Entry("acquire reusing the leaseID of the holding just released", hostile{state: freeHistory, by: "alice",
			do:   update(acquire(holder("alice", 0))),
			want: []string{leaseIDTag + msgLeaseID}}),
		Entry("another user acquiring with a recently used leaseID", hostile{state: freeHistory, by: "bob",
			do: update(acquire(func() locksv1alpha1.LockHolder {
				h := holder("bob", 1)
				h.LeaseID = leaseID("alice", 0)
				return h
			}())),
			want: []string{leaseIDTag + msgLeaseID}}),

		// --- terminating -----------------------------------------------------------------------
		Entry("acquiring a Terminating lock", hostile{state: free, setup: terminates, by: "bob",
			do:   update(acquire(holder("bob", 1))),
			want: []string{terminating + msgTerminating}}),
		Entry("queueing for a Terminating lock", hostile{state: held, setup: terminates, by: "bob",
			do:   update(enqueue(waiter("bob", 1))),
			want: []string{terminating + msgTerminating}}),

		// --- class 11: names people read are printable ----------------------------------------
		Entry("a holder identity with a terminal escape sequence", hostile{state: free, by: "bob",
			do:   update(acquire(identityOf("bob", "bob\x1b]0;pwned\x07\x1b[2J"))),
			want: []string{"status.holder.identity: Invalid value", "holder.identity " + identityPattern}}),
		Entry("a holder identity with a NUL", hostile{state: free, by: "bob",
			do:   update(acquire(identityOf("bob", "bob\x00alice"))),
			want: []string{"status.holder.identity: Invalid value", "holder.identity " + identityPattern}}),
		Entry("a holder identity with a right-to-left override (U+202E)", hostile{state: free, by: "bob",
			do:   update(acquire(identityOf("bob", "bob\u202etxt.exe"))),
			want: []string{"status.holder.identity: Invalid value", "holder.identity " + identityPattern}}),
		Entry("a waiter podName with a terminal escape sequence (a writer without a pod-bound token)", hostile{state: held, by: "bob",
			do: update(enqueue(func() locksv1alpha1.Waiter {
				w := waiter("bob", 1)
				w.PodName = "\x1b[2Jworker-0"
				return w
			}())),
			want: []string{"podName " + podNamePattern}}),
		Entry("a holder podUID with a right-to-left override (U+202E)", hostile{state: free, by: "bob",
			do: update(acquire(func() locksv1alpha1.LockHolder {
				h := holder("bob", 1)
				h.PodUID = "uid-\u202e0"
				return h
			}())),
			want: []string{"podUID " + podUIDPattern}}),
		Entry("a waiter identity with a terminal escape sequence", hostile{state: held, by: "bob",
			do: update(enqueue(func() locksv1alpha1.Waiter {
				w := waiter("bob", 1)
				w.Identity = "\x1b[1;31mROOT\x1b[0m"
				return w
			}())),
			want: []string{"identity " + identityPattern}}),
	}
}

// identityOf is user's holding number 1 shown as identity.
func identityOf(user, identity string) locksv1alpha1.LockHolder {
	h := holder(user, 1)
	h.Identity = identity
	return h
}
