package controllers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/validate/content"
	apimachineryvalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// The names an attacker wrote past admission: each one cannot name an object.
const (
	pathName    = "../../../../../version"
	upperName   = "Worker-0"
	slashName   = "worker/0"
	notAUUID    = "uid-worker-0"
	upperUUID   = "6F3C9A1E-2B4D-4E8F-9A0B-1C2D3E4F5A6B"
	badSAUser   = "system:serviceaccount:Shop:worker"
	extraSAUser = "system:serviceaccount:shop:worker:extra"
)

func TestPodOf(t *testing.T) {
	for _, tt := range []struct {
		name, user, podName, podUID string
		want                        podBinding
	}{
		{"a service account's pod", owner, "worker-0", podUID1, podBound},
		{"no pod name", owner, "", podUID1, notPodBound},
		{"no pod UID", owner, "worker-0", "", notPodBound},
		{"a user that is no service account: its pods' namespace is unknown", "alice", pathName, notAUUID, notPodBound},
		{"a path for a name", owner, pathName, podUID1, boundToNoPod},
		{"an upper-case name", owner, upperName, podUID1, boundToNoPod},
		{"a name with a slash", owner, slashName, podUID1, boundToNoPod},
		{"a name too long", owner, strings.Repeat("a", 254), podUID1, boundToNoPod},
		{"a UID that is no UUID", owner, "worker-0", notAUUID, boundToNoPod},
		{"an upper-case UUID (the apiserver writes lower case)", owner, "worker-0", upperUUID, boundToNoPod},
		{"a service account in a namespace no namespace can have", badSAUser, "worker-0", podUID1, boundToNoPod},
		{"a service account user with a part too many", extraSAUser, "worker-0", podUID1, boundToNoPod},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ref, got := podOf(tt.user, tt.podName, tt.podUID)
			if got != tt.want {
				t.Fatalf("podOf(%q, %q, %q) = %v, want %v", tt.user, tt.podName, tt.podUID, got, tt.want)
			}
			if got == podBound && ref != podIn(tt.podName, tt.podUID) {
				t.Errorf("podOf() = %+v, want %+v", ref, podIn(tt.podName, tt.podUID))
			}
		})
	}
}

func TestValidSessionName(t *testing.T) {
	for name, want := range map[string]bool{
		"worker-s1": true, "worker.s1": true, "": false, pathName: false, "Worker": false, "a/b": false, "..": false,
		strings.Repeat("a", 253): true, strings.Repeat("a", 254): false,
	} {
		if got := validSessionName(name); got != want {
			t.Errorf("validSessionName(%q) = %v, want %v", name, got, want)
		}
	}
}

// TestDecideWithWhatCannotBeRead: an entry whose session or pod is unknown
// (its read failed) stays as it is while everything else about the lock is
// decided; an entry whose reference names nothing is decided without a read.
func TestDecideWithWhatCannotBeRead(t *testing.T) {
	bindPod := func(user, podName, podUID string) func(*locksv1alpha1.LockHolder) {
		return func(h *locksv1alpha1.LockHolder) { h.User, h.PodName, h.PodUID = user, podName, podUID }
	}
	holderOf := func(change func(*locksv1alpha1.LockHolder)) lockOpt {
		return func(l *locksv1alpha1.DistributedLock) { change(l.Status.Holder) }
	}
	sharedOf := func(leaseID string, change func(*locksv1alpha1.LockHolder)) lockOpt {
		return func(l *locksv1alpha1.DistributedLock) {
			change(&l.Status.SharedHolders[l.Status.SharedIndex(leaseID)].LockHolder)
		}
	}
	waiterOf := func(requestID string, change func(*locksv1alpha1.Waiter)) lockOpt {
		return func(l *locksv1alpha1.DistributedLock) { change(&l.Status.Waiters[l.Status.WaiterIndex(requestID)]) }
	}
	waiterPod := func(user, podName, podUID string) func(*locksv1alpha1.Waiter) {
		return func(w *locksv1alpha1.Waiter) { w.User, w.PodName, w.PodUID = user, podName, podUID }
	}
	inSessionNamed := func(name string) func(*locksv1alpha1.Waiter) {
		return func(w *locksv1alpha1.Waiter) { w.User, w.Session = owner, name }
	}
	aliveSession := map[string]sessionState{"worker-s1": {name: "worker-s1", session: newSession(), seen: sessionObservation{uid: "session-uid-1", renewSeen: t0}}}
	podDrop := func(requestID string) droppedWaiter {
		return droppedWaiter{requestID: requestID, identity: "w-" + requestID, reason: dropPodDeleted}
	}
	tests := []decideCase{
		{
			name: "a reader whose session is unknown stays; the other reader's lease still expires",
			history: []observed{{0, newLock(rwMutex, sharing("r1", 0, 50, 10, clientTime), sharedIn("r1", "worker-s1"),
				sharing("r2", 1, 51, 10, clientTime))}},
			at:   12 * time.Second,
			want: decision{ends: []ending{expiredShared("r2", 1, 51, 10)}},
		},
		{
			name:    "a holding whose session is unknown is kept however long it is unknown",
			history: []observed{{0, newLock(held("a", 10, clientTime), inSession("worker-s1"))}},
			at:      time.Hour,
			want:    decision{},
		},
		{
			name:    "a holding whose pod is unknown is still timed by its lease: kept before lease + grace",
			history: []observed{{0, newLock(held("a", 30, clientTime), holderOf(bindPod(owner, "worker-0", podUID1)))}},
			at:      31 * time.Second,
			want:    decision{requeueAfter: time.Second},
		},
		{
			name:    "a holding whose pod is unknown expires at lease + grace",
			history: []observed{{0, newLock(held("a", 30, clientTime), holderOf(bindPod(owner, "worker-0", podUID1)))}},
			at:      32 * time.Second,
			want:    decision{ends: []ending{expiredAfter(30)}},
		},
		{
			name: "waiters whose session or pod is unknown stay; another waiter past its deadline is dropped",
			history: []observed{{0, newLock(held("a", 300, clientTime),
				waiting("w1", time.Hour), waiterOf("w1", inSessionNamed("worker-s1")),
				waiting("w2", time.Hour), waiterOf("w2", waiterPod(owner, "worker-0", podUID1)),
				waiting("w3", 10*time.Second))}},
			at:   10 * time.Second,
			want: decision{drop: []droppedWaiter{{requestID: "w3", identity: "w-w3", reason: dropWaitTimeout}}},
		},
		{
			name: "a head whose session is unknown is still dropped at the hand-off timeout",
			history: []observed{{0, newLock(withToken(42), waiting("w1", time.Hour), waiterOf("w1", inSessionNamed("worker-s1")),
				waiting("w2", time.Hour))}},
			at:   10 * time.Second,
			want: decision{drop: []droppedWaiter{{requestID: "w1", identity: "w-w1", reason: dropHandoffTimeout}}},
		},
		{
			name: "a waiter whose session is unknown is still dropped at its deadline",
			history: []observed{{0, newLock(held("a", 300, clientTime),
				waiting("w1", 5*time.Second), waiterOf("w1", inSessionNamed("worker-s1")))}},
			at:   5 * time.Second,
			want: decision{drop: []droppedWaiter{{requestID: "w1", identity: "w-w1", reason: dropWaitTimeout}}},
		},

		// References that name nothing.
		{
			name:    "a holding bound to a pod by a path is timed by its lease, never ended for its pod",
			history: []observed{{0, newLock(held("a", 6, clientTime), holderOf(bindPod(owner, pathName, podUID1)))}},
			at:      7 * time.Second,
			live:    liveness{podsGone: map[podRef]bool{podIn("worker-0", podUID1): true}},
			want:    decision{requeueAfter: time.Second},
		},
		{
			name:    "a holding bound to a pod by a path expires at lease + grace",
			history: []observed{{0, newLock(held("a", 6, clientTime), holderOf(bindPod(owner, pathName, podUID1)))}},
			at:      8 * time.Second,
			want:    decision{ends: []ending{expiredAfter(6)}},
		},
		{
			name: "readers bound to pod references no pod can have are timed by their leases",
			history: []observed{{0, newLock(rwMutex,
				sharing("r1", 0, 50, 10, clientTime), sharedOf("r1", bindPod(owner, "worker-0", notAUUID)),
				sharing("r2", 1, 51, 10, clientTime), sharedOf("r2", bindPod(badSAUser, "worker-0", podUID1)),
				sharing("r3", 2, 52, 20, clientTime), sharedOf("r3", bindPod(owner, upperName, podUID1)))}},
			at: 12 * time.Second,
			want: decision{ends: []ending{
				expiredShared("r1", 0, 50, 10),
				expiredShared("r2", 1, 51, 10),
			}},
		},
		{
			name: "waiters bound to pod references no pod can have are dropped at once; a user that is no service account keeps its entry",
			history: []observed{{0, newLock(held("a", 300, clientTime),
				waiting("w1", time.Hour), waiterOf("w1", waiterPod(owner, pathName, podUID1)),
				waiting("w2", time.Hour), waiterOf("w2", waiterPod(owner, "worker-0", notAUUID)),
				waiting("w3", time.Hour), waiterOf("w3", waiterPod(badSAUser, "worker-0", podUID1)),
				waiting("w4", time.Hour), waiterOf("w4", waiterPod("alice", pathName, notAUUID)),
				waiting("w5", time.Hour), waiterOf("w5", waiterPod(owner, slashName, podUID1)))}},
			want: decision{drop: []droppedWaiter{podDrop("w1"), podDrop("w2"), podDrop("w3"), podDrop("w5")}},
		},
		{
			name: "a head bound to a path is dropped at once, not after the hand-off timeout",
			history: []observed{{0, newLock(withToken(42),
				waiting("w1", time.Hour), waiterOf("w1", waiterPod(owner, pathName, podUID1)), waiting("w2", time.Hour))}},
			want: decision{drop: []droppedWaiter{podDrop("w1")}},
		},
		{
			name: "a holding and a waiter whose session field names no LockSession end SessionClosed at once",
			history: []observed{{0, newLock(held("a", 300, clientTime), inSession(pathName),
				waiting("w1", time.Hour), waiterOf("w1", inSessionNamed("Worker_S1")))}},
			live: liveness{sessions: aliveSession},
			want: decision{
				ends: []ending{endOf("a", 42, nil, ending{reason: locksv1alpha1.EndReasonSessionClosed,
					why: "its session field names no LockSession (not a valid object name)"})},
				drop: []droppedWaiter{{requestID: "w1", identity: "w-w1", reason: dropSessionClosed}},
			},
		},
		{
			name: "two readers with one leaseID, written past admission, are kept: ending one by its leaseID could end the other",
			history: []observed{{0, newLock(rwMutex, sharing("r1", 0, 50, 10, clientTime), sharedIn("r1", pathName),
				sharing("r1", 1, 51, 10, clientTime), sharing("r2", 2, 52, 10, clientTime))}},
			at:   12 * time.Second,
			want: decision{ends: []ending{expiredShared("r2", 2, 52, 10)}},
		},
		{
			name: "a pod gone under one name ends only the holding bound to that name, not another with the same UID",
			history: []observed{{0, newLock(rwMutex,
				sharing("r1", 0, 50, 300, clientTime), sharedOf("r1", bindPod(owner, "worker-0", podUID1)),
				sharing("r2", 1, 51, 300, clientTime), sharedOf("r2", bindPod(owner, "worker-1", podUID1)))}},
			at:   time.Second,
			live: liveness{podsGone: map[podRef]bool{podIn("worker-0", podUID1): true, podIn("worker-1", podUID1): false}},
			want: decision{ends: []ending{endOf("r1", 50, ptr.To[int32](0), ending{reason: locksv1alpha1.EndReasonExpired, why: "holder pod worker-0 deleted"})}},
		},
	}
	runDecideCases(t, tests)
}

// world is the sessions and pods a fake reader serves, as both the
// controller's cache and its live reads. Reads of the keys in fail fail
// (not with NotFound); every key read is recorded.
type world struct {
	sessions map[types.NamespacedName]*locksv1alpha1.LockSession
	pods     map[types.NamespacedName]types.UID
	fail     map[types.NamespacedName]bool
	reads    []types.NamespacedName
}

var errInjected = errors.New("injected read failure")

func (w *world) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	w.reads = append(w.reads, key)
	if w.fail[key] {
		return errInjected
	}
	switch o := obj.(type) {
	case *locksv1alpha1.LockSession:
		s, ok := w.sessions[key]
		if !ok {
			return apierrors.NewNotFound(schema.GroupResource{Group: lockGVK.Group, Resource: "locksessions"}, key.Name)
		}
		s.DeepCopyInto(o)
		return nil
	case *metav1.PartialObjectMetadata:
		uid, ok := w.pods[key]
		if !ok {
			return apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, key.Name)
		}
		o.Namespace, o.Name, o.UID = key.Namespace, key.Name, uid
		return nil
	}
	return fmt.Errorf("world serves sessions and pods, not %T", obj)
}

func (*world) List(context.Context, client.ObjectList, ...client.ListOption) error { return nil }

// invalidReads lists the keys read that no object can have.
func (w *world) invalidReads() []types.NamespacedName {
	var bad []types.NamespacedName
	for _, k := range w.reads {
		if len(apimachineryvalidation.ValidateNamespaceName(k.Namespace, false)) > 0 || len(apimachineryvalidation.NameIsDNSSubdomain(k.Name, false)) > 0 ||
			len(content.IsPathSegmentName(k.Name)) > 0 {
			bad = append(bad, k)
		}
	}
	return bad
}

// reconcilerOf is a Reconciler that reads w and decides on clock now.
func reconcilerOf(w *world) *Reconciler {
	return &Reconciler{reader: w, apiReader: w, timing: testTiming, events: EventsImportant}
}

// quiet is a context whose logger discards: the reads that fail on purpose log errors.
func quiet() context.Context { return log.IntoContext(context.Background(), logr.Discard()) }

// TestLivenessDecidesPastFailedReads: one session and one pod whose reads
// fail leave their entries unknown and every other entry read; nothing is
// read by a name no object can have.
func TestLivenessDecidesPastFailedReads(t *testing.T) {
	shop := func(name string) types.NamespacedName { return types.NamespacedName{Namespace: "shop", Name: name} }
	w := &world{
		sessions: map[types.NamespacedName]*locksv1alpha1.LockSession{shop("worker-s1"): newSession()},
		pods:     map[types.NamespacedName]types.UID{shop("worker-1"): podUID2},
		fail:     map[types.NamespacedName]bool{shop("flaky"): true, shop("worker-0"): true},
	}
	l := newLock(semaphore(4),
		sharing("s0", 0, 60, 10, clientTime), sharedIn("s0", "worker-s1"),
		sharing("s1", 1, 61, 10, clientTime), sharedIn("s1", "flaky"),
		sharing("s2", 2, 62, 10, clientTime), sharedIn("s2", pathName),
		sharing("s3", 3, 63, 10, clientTime), sharedOfPod("s3", "worker-0", podUID1),
		waitingFor("q1", locksv1alpha1.Shared, time.Hour), func(l *locksv1alpha1.DistributedLock) {
			l.Status.Waiters[0].User, l.Status.Waiters[0].PodName, l.Status.Waiters[0].PodUID = owner, "worker-1", podUID2
		},
		waitingFor("q2", locksv1alpha1.Shared, time.Hour), func(l *locksv1alpha1.DistributedLock) {
			l.Status.Waiters[1].User, l.Status.Waiters[1].PodName, l.Status.Waiters[1].PodUID = owner, pathName, podUID2
		})
	live, failed := reconcilerOf(w).liveness(quiet(), l, t0)
	if !failed {
		t.Error("liveness() reported no failed read")
	}
	if bad := w.invalidReads(); len(bad) > 0 {
		t.Errorf("read %v, which no object can be", bad)
	}
	if _, known := live.session("flaky"); known {
		t.Error("a session whose read failed is known")
	}
	if st, known := live.session("worker-s1"); !known || st.session == nil {
		t.Errorf("session worker-s1 = %+v, %v; want it read", st, known)
	}
	if diff := cmp.Diff(map[podRef]bool{podIn("worker-1", podUID2): false}, live.podsGone, cmp.AllowUnexported(podRef{})); diff != "" {
		t.Errorf("podsGone (-want +got):\n%s", diff)
	}
	got := decide(l, mustObserve(l, t0), live, t0.Add(5*time.Second), testTiming)
	want := decision{
		ends: []ending{endOf("s2", 62, ptr.To[int32](2), ending{reason: locksv1alpha1.EndReasonSessionClosed,
			why: "its session field names no LockSession (not a valid object name)"})},
		drop: []droppedWaiter{{requestID: "q2", identity: "w-q2", reason: dropPodDeleted}},
	}
	if diff := cmp.Diff(want, got, cmpDecision); diff != "" {
		t.Errorf("decide() mismatch (-want +got):\n%s", diff)
	}
}

func mustObserve(l *locksv1alpha1.DistributedLock, at time.Time) observation {
	o, _ := observe(nil, l, at)
	return o
}

// A lock whose reads failed comes back after a backoff that doubles per
// failure, or at its deadline if that is sooner; one read whole starts over.
func TestReadBackoff(t *testing.T) {
	var b readBackoff
	key := types.NamespacedName{Namespace: "shop", Name: "db"}
	deadline := atDeadline(time.Second)
	var got []time.Duration
	for range 4 {
		got = append(got, b.retry(key, deadline, true).RequeueAfter)
	}
	if want := []time.Duration{200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, time.Second}; !cmp.Equal(want, got) {
		t.Errorf("requeues = %v, want %v", got, want)
	}
	if res := b.retry(key, ctrl.Result{}, true); res.RequeueAfter != 3200*time.Millisecond || res.Priority == nil {
		t.Errorf("without a deadline: %+v, want the backoff, 3.2s, with the deadlines' priority", res)
	}
	if res := b.retry(key, deadline, false); res != deadline {
		t.Errorf("all read: %+v, want the deadline %+v", res, deadline)
	}
	if res := b.retry(key, ctrl.Result{}, true); res.RequeueAfter != readRetryBase {
		t.Errorf("after a whole read: %s, want the base %s again", res.RequeueAfter, readRetryBase)
	}
}
