package admission

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	kwebhook "github.com/kubelock/kubelock/webhook"
)

// hostile is one malformed or malicious request: from a lock in state, the
// user named by is writes with do, and the apiserver must reject it with a
// message containing every string of want, leaving the lock untouched.
type hostile struct {
	state state
	by    string
	do    func(ctx context.Context, u *user, key client.ObjectKey) error
	want  []string
}

// tag is the start of a denial message of an admission rule.
func tag(r kwebhook.Rule) string { return "[kubelock:" + string(r) + "] " }

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
	return []TableEntry{
		// --- only the holder renews or releases -------------------------------
		Entry("renew by another user", hostile{state: held, by: "bob", do: update(renew),
			want: []string{tag(kwebhook.RuleHolderOnly) + `only the holder "alice" may renew lease ` + leaseID("alice", 1)}}),
		Entry("release by another user", hostile{state: held, by: "bob", do: update(end(locksv1alpha1.EndReasonReleased, "bob")),
			want: []string{tag(kwebhook.RuleHolderOnly) + `only the holder "alice" may release lease ` + leaseID("alice", 1)}}),
		Entry("the controller renewing someone's lease", hostile{state: held, by: controllerUser, do: update(renew),
			want: []string{tag(kwebhook.RuleHolderOnly) + `only the holder "alice" may renew`}}),
		Entry("renew by the holder's user with its old leaseID", hostile{state: heldHistory, by: "alice",
			do:   update(renew, func(l *locksv1alpha1.DistributedLock) { l.Status.Holder.LeaseID = leaseID("alice", 0) }),
			want: []string{"a held lock cannot pass to another leaseID; release it first"}}),
		Entry("release by the holder's user with another leaseID", hostile{state: held, by: "alice",
			do: update(end(locksv1alpha1.EndReasonReleased, "alice"), func(l *locksv1alpha1.DistributedLock) {
				lastRecord(l).LeaseID = leaseID("alice", 7)
			}),
			want: []string{"a holding that ends must be recorded in recentAcquisitions"}}),
		Entry("JSON merge patch that sets another holder on a held lock", hostile{state: held, by: "bob",
			do:   patch(types.MergePatchType, map[string]any{"status": map[string]any{"holder": holderJSON("bob", 1)}}),
			want: []string{"a held lock cannot pass to another leaseID; release it first", "holder.user cannot change while the lock is held"}}),
		Entry("JSON patch that replaces the holder of a held lock", hostile{state: held, by: "bob",
			do:   patch(types.JSONPatchType, []map[string]any{{"op": "replace", "path": "/status/holder", "value": holderJSON("bob", 1)}}),
			want: []string{"a held lock cannot pass to another leaseID; release it first"}}),
		Entry("JSON patch that removes the holder without a record", hostile{state: held, by: "bob",
			do:   patch(types.JSONPatchType, []map[string]any{{"op": "remove", "path": "/status/holder"}}),
			want: []string{"a holding that ends must be recorded in recentAcquisitions"}}),
		Entry("JSON patch that releases in the holder's name", hostile{state: held, by: "bob",
			do: func(ctx context.Context, u *user, key client.ObjectKey) error {
				token := get(ctx, key).Status.FencingToken
				return patch(types.JSONPatchType, []map[string]any{
					{"op": "remove", "path": "/status/holder"},
					{"op": "add", "path": "/status/recentAcquisitions", "value": []map[string]any{{
						"requestID": requestID("alice", 1), "leaseID": leaseID("alice", 1), "identity": "alice", "fencingToken": token,
						"endTime": metav1.NowMicro(), "endReason": "Released", "endedBy": "alice",
					}}},
				})(ctx, u, key)
			},
			want: []string{tag(kwebhook.RuleIdentity) + `endedBy must be the requesting user "bob", not "alice"`}}),

		// --- fencing tokens ------------------------------------------------------
		Entry("acquire with a token lower than allowed (the resourceVersion)", hostile{state: freeHistory, by: "bob",
			do:   update(acquire(holder("bob", 1)), tokenDelta(-1)),
			want: []string{tag(kwebhook.RuleFencingToken) + "an acquisition's fencingToken must be the lock's resourceVersion + 1"}}),
		Entry("acquire with a token higher than allowed", hostile{state: freeHistory, by: "bob",
			do:   update(acquire(holder("bob", 1)), tokenDelta(+1)),
			want: []string{tag(kwebhook.RuleFencingToken) + "an acquisition's fencingToken must be the lock's resourceVersion + 1"}}),
		Entry("acquire with a token equal to the current one", hostile{state: freeHistory, by: "bob",
			do:   update(func(l *locksv1alpha1.DistributedLock) { l.Acquire(holder("bob", 1), l.Status.FencingToken) }),
			want: []string{"an acquisition must raise fencingToken"}}),
		Entry("acquire with a token lower than the current one", hostile{state: freeHistory, by: "bob",
			do:   update(func(l *locksv1alpha1.DistributedLock) { l.Acquire(holder("bob", 1), l.Status.FencingToken-1) }),
			want: []string{"fencingToken must not decrease"}}),
		Entry("a renewal that raises the token", hostile{state: held, by: "alice", do: update(renew, tokenDelta(+1)),
			want: []string{"fencingToken may change only when a new holder acquires the lock"}}),
		Entry("acquire without counting the transition", hostile{state: freeHistory, by: "bob",
			do:   update(acquire(holder("bob", 1)), func(l *locksv1alpha1.DistributedLock) { l.Status.Transitions-- }),
			want: []string{"transitions must grow by exactly one on each acquisition"}}),

		// --- identity ------------------------------------------------------------
		Entry("acquire with a forged holder.user", hostile{state: free, by: "bob", do: update(acquire(holder("alice", 1))),
			want: []string{tag(kwebhook.RuleIdentity) + `holder.user must be the requesting user "bob", not "alice"`}}),
		Entry("enqueue with a forged waiter user", hostile{state: held, by: "bob", do: update(enqueue(waiter("carol", 1))),
			want: []string{tag(kwebhook.RuleIdentity) + `a waiter's user must be the requesting user "bob", not "carol"`}}),
		Entry("a pod's service account acquiring in another pod's name", hostile{state: free, by: podSA,
			do: update(acquire(func() locksv1alpha1.LockHolder {
				h := holder(podSA, 1)
				h.PodName = "worker-1"
				return h
			}())),
			want: []string{tag(kwebhook.RulePodBinding) + `holder.podName "worker-1" is not the requesting pod "worker-0"`}}),
		Entry("release recorded as ended by someone else", hostile{state: held, by: "alice", do: update(end(locksv1alpha1.EndReasonReleased, "bob")),
			want: []string{tag(kwebhook.RuleIdentity) + `endedBy must be the requesting user "alice", not "bob"`}}),

		// --- the wait queue -------------------------------------------------------
		Entry("acquire while not the queue head", hostile{state: freeQueue, by: "carol", do: update(acquire(holder("carol", 1))),
			want: []string{tag(kwebhook.RuleQueueHead) + "only the head of the wait queue (requestID " + requestID("bob", 1) + ` of "bob") may acquire`}}),
		Entry("acquire with the head's requestID by another user", hostile{state: freeQueue, by: "carol",
			do: update(acquire(func() locksv1alpha1.LockHolder {
				h := holder("carol", 1)
				h.RequestID = requestID("bob", 1)
				return h
			}())),
			want: []string{tag(kwebhook.RuleQueueHead) + "only the head of the wait queue (requestID " + requestID("bob", 1) + ` of "bob") may acquire; request ` +
				requestID("bob", 1) + ` of "carol" is not`}}),
		Entry("acquire by a stranger while others wait", hostile{state: freeQueue, by: "dave", do: update(acquire(holder("dave", 1))),
			want: []string{tag(kwebhook.RuleQueueHead) + "only the head of the wait queue"}}),
		Entry("the head acquiring and dropping the next waiter", hostile{state: freeQueue, by: "bob",
			do: update(func(l *locksv1alpha1.DistributedLock) {
				h := holder("bob", 1)
				l.Status.RemoveWaiter(requestID("carol", 1))
				acquire(h)(l)
			}),
			want: []string{tag(kwebhook.RuleQueue) + `"bob" may remove only its own queue entries, not ` + requestID("carol", 1) + " (user carol)"}}),
		Entry("a waiter removing another waiter", hostile{state: heldQueue, by: "carol",
			do:   update(func(l *locksv1alpha1.DistributedLock) { l.Status.RemoveWaiter(requestID("bob", 1)) }),
			want: []string{tag(kwebhook.RuleQueue) + `"carol" may remove only its own queue entries, not ` + requestID("bob", 1)}}),
		Entry("a waiter inserted not at the tail", hostile{state: heldQueue, by: "dave",
			do: update(func(l *locksv1alpha1.DistributedLock) {
				l.Status.Waiters = append([]locksv1alpha1.Waiter{waiter("dave", 1)}, l.Status.Waiters...)
				l.Status.WaiterCount++
			}),
			want: []string{tag(kwebhook.RuleQueue) + "waiters join only at the tail and keep their order"}}),
		Entry("reordering the queue", hostile{state: heldQueue, by: "carol",
			do: update(func(l *locksv1alpha1.DistributedLock) {
				w := l.Status.Waiters
				w[0], w[1] = w[1], w[0]
			}),
			want: []string{tag(kwebhook.RuleQueue) + "waiters join only at the tail and keep their order"}}),
		Entry("a waiter rewriting its queue entry", hostile{state: heldQueue, by: "bob",
			do: update(func(l *locksv1alpha1.DistributedLock) {
				l.Status.Waiters[0].Deadline = metav1.NewMicroTime(l.Status.Waiters[0].Deadline.Add(time.Hour))
			}),
			want: []string{tag(kwebhook.RuleQueue) + "queue entry " + requestID("bob", 1) + " cannot change"}}),
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
			want: []string{tag(kwebhook.RuleHolderFields) + "while lease " + leaseID("alice", 1) + " is held only holder.renewTime may change"}}),
		Entry("adding holder.podName while held", hostile{state: held, by: "alice",
			do:   update(func(l *locksv1alpha1.DistributedLock) { l.Status.Holder.PodName = "elsewhere" }),
			want: []string{tag(kwebhook.RuleHolderFields) + "while lease " + leaseID("alice", 1) + " is held only holder.renewTime may change"}}),

		// --- ending a holding --------------------------------------------------------
		Entry("an unknown endReason", hostile{state: held, by: "alice", do: update(end("Stolen", "alice")),
			want: []string{`endReason: Unsupported value: "Stolen": supported values: "Released", "Expired", "ForceReleased"`}}),
		Entry("release without the record", hostile{state: held, by: "alice",
			do:   update(func(l *locksv1alpha1.DistributedLock) { l.Status.Holder = nil }),
			want: []string{"a holding that ends must be recorded in recentAcquisitions"}}),
		Entry("release with a wrong record", hostile{state: held, by: "alice",
			do: update(end(locksv1alpha1.EndReasonReleased, "alice"), func(l *locksv1alpha1.DistributedLock) {
				lastRecord(l).FencingToken++
			}),
			want: []string{tag(kwebhook.RuleEndRecord) + "the record must describe the ending holding: leaseID " + leaseID("alice", 1)}}),
		Entry("release appending two records", hostile{state: held, by: "alice",
			do: update(end(locksv1alpha1.EndReasonReleased, "alice"), func(l *locksv1alpha1.DistributedLock) {
				l.Status.RecentAcquisitions = append(l.Status.RecentAcquisitions, *lastRecord(l))
			}),
			want: []string{tag(kwebhook.RuleEndRecord) + "ending the holding of lease " + leaseID("alice", 1) + " must append exactly its record"}}),
		Entry("release that rewrites an earlier record", hostile{state: heldHistory, by: "alice",
			do: update(end(locksv1alpha1.EndReasonReleased, "alice"), func(l *locksv1alpha1.DistributedLock) {
				l.Status.RecentAcquisitions[0].EndReason = locksv1alpha1.EndReasonExpired
			}),
			want: []string{tag(kwebhook.RuleEndRecord) + "ending a holding must keep the earlier records of recentAcquisitions unchanged"}}),
		Entry("expiry by a non-controller", hostile{state: held, by: "bob", do: update(end(locksv1alpha1.EndReasonExpired, "bob")),
			want: []string{tag(kwebhook.RuleControllerOnly) + `only the kubelock controller may expire a lease; "bob" is not the controller`}}),
		Entry("the holder marking its own lease expired", hostile{state: held, by: "alice", do: update(end(locksv1alpha1.EndReasonExpired, "alice")),
			want: []string{tag(kwebhook.RuleControllerOnly) + `only the kubelock controller may expire a lease; "alice" is not the controller`}}),
		Entry("force-release without the verb", hostile{state: held, by: "bob", do: update(end(locksv1alpha1.EndReasonForceReleased, "bob")),
			want: []string{tag(kwebhook.RuleForceRelease) + `user "bob" may not force-release: it needs the "force-release" verb`}}),

		// --- the controller ----------------------------------------------------------
		Entry("the controller acquiring", hostile{state: free, by: controllerUser, do: update(acquire(holder(controllerUser, 1))),
			want: []string{tag(kwebhook.RuleControllerOnly) + "the controller may expire holdings but never acquire a lock"}}),
		Entry("the controller enqueuing", hostile{state: held, by: controllerUser, do: update(enqueue(waiter(controllerUser, 1))),
			want: []string{tag(kwebhook.RuleControllerOnly) + "the controller may drop waiters but never enqueue"}}),

		// --- history -----------------------------------------------------------------
		Entry("a merge patch that drops recentAcquisitions", hostile{state: freeHistory, by: "alice",
			do:   patch(types.MergePatchType, map[string]any{"status": map[string]any{"recentAcquisitions": nil}}),
			want: []string{tag(kwebhook.RuleHistory) + "recentAcquisitions changes only when a holding ends"}}),
		Entry("a JSON patch that rewrites history", hostile{state: freeHistory, by: "bob",
			do:   patch(types.JSONPatchType, []map[string]any{{"op": "replace", "path": "/status/recentAcquisitions/0/endedBy", "value": "bob"}}),
			want: []string{tag(kwebhook.RuleHistory) + "recentAcquisitions changes only when a holding ends"}}),

		// --- server-side apply --------------------------------------------------------
		Entry("server-side apply that takes ownership of the holder", hostile{state: held, by: "bob",
			do:   apply(map[string]any{"holder": holderJSON("bob", 1)}),
			want: []string{"a held lock cannot pass to another leaseID; release it first"}}),
		Entry("server-side apply that renews someone else's lease", hostile{state: held, by: "bob",
			do: apply(map[string]any{"holder": map[string]any{
				"user": "alice", "leaseID": leaseID("alice", 1), "renewTime": metav1.NewMicroTime(time.Now().Add(time.Hour)),
			}}),
			want: []string{tag(kwebhook.RuleHolderOnly) + `only the holder "alice" may renew lease ` + leaseID("alice", 1)}}),

		// --- deletion ----------------------------------------------------------------
		Entry("deleting a held lock", hostile{state: held, by: "deleter",
			do: func(ctx context.Context, u *user, key client.ObjectKey) error {
				return u.c.Delete(ctx, &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}})
			},
			want: []string{tag(kwebhook.RuleHeldDelete) + "lock ", " is held by alice (lease " + leaseID("alice", 1) + "); release it first"}}),
	}
}

// leaseOf is user's holding asking for a lease of seconds.
func leaseOf(user string, seconds int32) locksv1alpha1.LockHolder {
	h := holder(user, 1)
	h.LeaseDurationSeconds = seconds
	return h
}
