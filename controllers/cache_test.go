package controllers

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// servedLock is lock i as the apiserver serves it: spec defaults, managed
// fields, and with held, a holder, the Held condition and a full history.
func servedLock(t testing.TB, i int, held bool) []byte {
	t.Helper()
	now := metav1.NewMicroTime(time.Now())
	l := locksv1alpha1.DistributedLock{
		TypeMeta: metav1.TypeMeta{APIVersion: locksv1alpha1.GroupVersion.String(), Kind: lockGVK.Kind},
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("l-%06d", i), Namespace: "bench", UID: "0c3c5f1e-7d4b-4d3c-9a8e-0123456789ab",
			ResourceVersion: fmt.Sprint(1000000 + i), Generation: 1, CreationTimestamp: metav1.Now(),
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "bench", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "locks.kubelock.io/v1alpha1",
				FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(`{"f:status":{"f:holder":{".":{},"f:identity":{},"f:leaseID":{},"f:user":{}}}}`)}}},
		Spec: locksv1alpha1.DistributedLockSpec{Type: locksv1alpha1.Mutex, LeaseDurationSeconds: 30, MaxLeaseDurationSeconds: 300, MaxWaiters: ptr.To[int32](128),
			HandoffTimeoutSeconds: 10, MaxWaitersPerUser: ptr.To[int32](16), MaxWaitSeconds: 3600},
	}
	if held {
		l.Status.Holder = &locksv1alpha1.LockHolder{Identity: "bench-client-3", User: "kubelock-bench-user", LeaseID: "1f0c2b7e9a4d4c1ea0c5b2d3e4f5a6b7",
			RequestID: "9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d", LeaseDurationSeconds: 30, AcquireTime: now, RenewTime: &now}
		l.Status.HolderCount, l.Status.FencingToken, l.Status.Transitions, l.Status.ObservedGeneration = 1, 1234567, 9, 1
		l.Status.Conditions = []metav1.Condition{{Type: locksv1alpha1.ConditionHeld, Status: metav1.ConditionTrue, Reason: "Acquired", Message: "held", LastTransitionTime: metav1.Now(), ObservedGeneration: 1}}
		for j := range locksv1alpha1.MaxRecentAcquisitions {
			l.Status.RecentAcquisitions = append(l.Status.RecentAcquisitions, locksv1alpha1.FinishedHolding{RequestID: "9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d",
				LeaseID: "1f0c2b7e9a4d4c1ea0c5b2d3e4f5a6b7", FencingToken: int64(1234500 + j), Identity: "bench-client-3", EndTime: now,
				EndReason: locksv1alpha1.EndReasonReleased, EndedBy: "kubelock-bench-user"})
		}
	}
	b, err := json.Marshal(l)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// heapPerObject is the live heap each of n objects keeps after decode, as
// the cache keeps them.
func heapPerObject(t *testing.T, n int, decode func(i int) any) int {
	t.Helper()
	keep := make([]any, n)
	before := liveHeap()
	for i := range keep {
		keep[i] = decode(i)
	}
	after := liveHeap()
	runtime.KeepAlive(keep)
	return int(int64(after-before) / int64(n))
}

func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// The operator's memory at 100,000 locks is mostly this cache (the budget:
// RSS ≤ 300 MiB, measured by the benchmark's scale workload). Each lock,
// decoded by the cache's scheme and stripped of managedFields, must stay
// within a budget that an unstructured cache (a map per JSON object, about
// three times the size) would exceed.
func TestCachedLockFootprint(t *testing.T) {
	s, err := cacheScheme()
	if err != nil {
		t.Fatal(err)
	}
	codec := serializer.NewCodecFactory(s).UniversalDeserializer()
	strip := cache.TransformStripManagedFields()
	const n = 2000
	for _, tc := range []struct {
		name         string
		held         bool
		budget       int // bytes per lock
		unstructured int // at least this much more as unstructured
	}{
		{"never used", false, 900, 2},
		{"held, full history", true, 3600, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw := make([][]byte, n)
			for i := range raw {
				raw[i] = servedLock(t, i, tc.held)
			}
			typed := heapPerObject(t, n, func(i int) any {
				obj, _, err := codec.Decode(raw[i], nil, nil)
				if err != nil {
					t.Fatal(err)
				}
				if _, ok := obj.(*cachedLock); !ok {
					t.Fatalf("decoded a %T", obj)
				}
				out, _ := strip(obj)
				return out
			})
			untyped := heapPerObject(t, n, func(i int) any {
				u := &unstructured.Unstructured{}
				if err := u.UnmarshalJSON(raw[i]); err != nil {
					t.Fatal(err)
				}
				out, _ := strip(u)
				return out
			})
			t.Logf("%s: %d B per lock cached (unstructured: %d B; served JSON %d B)", tc.name, typed, untyped, len(raw[0]))
			if typed > tc.budget {
				t.Errorf("%s: %d B per cached lock, budget %d B", tc.name, typed, tc.budget)
			}
			if untyped < tc.unstructured*typed {
				t.Errorf("%s: the footprint test no longer tells an unstructured cache (%d B) from the typed one (%d B)", tc.name, untyped, typed)
			}
		})
	}
}

// Events about locks with holdings or waiters, and deadlines, go first; a
// new leader's initial list puts idle locks behind everything else; a
// resync is low too.
func TestEnqueueLocksByWhatTheyTime(t *testing.T) {
	q := priorityqueue.New[reconcile.Request]("test")
	defer q.ShutDown()
	lock := func(name string, opts ...lockOpt) *cachedLock {
		l := &cachedLock{DistributedLock: *newLock(opts...)}
		l.Name = name
		return l
	}
	queued := func(l *locksv1alpha1.DistributedLock) { l.Status.Waiters = []locksv1alpha1.Waiter{{RequestID: "r"}} }
	var h enqueueLocks
	ctx := context.Background()
	for _, l := range []*cachedLock{lock("idle-listed"), lock("held-listed", held("l1", 30, clientTime)), lock("queued-listed", queued)} {
		h.Create(ctx, event.TypedCreateEvent[*cachedLock]{Object: l, IsInInitialList: true}, q)
	}
	h.Create(ctx, event.TypedCreateEvent[*cachedLock]{Object: lock("created")}, q)
	released, acquired := lock("released"), lock("acquired", held("l2", 30, clientTime))
	released.ResourceVersion, acquired.ResourceVersion = "101", "101"
	h.Update(ctx, event.TypedUpdateEvent[*cachedLock]{ObjectOld: lock("released", held("l3", 30, clientTime)), ObjectNew: released}, q)
	h.Update(ctx, event.TypedUpdateEvent[*cachedLock]{ObjectOld: lock("acquired"), ObjectNew: acquired}, q)
	h.Update(ctx, event.TypedUpdateEvent[*cachedLock]{ObjectOld: lock("resynced", held("l4", 30, clientTime)), ObjectNew: lock("resynced", held("l4", 30, clientTime))}, q)
	q.AddWithOpts(priorityqueue.AddOpts{Priority: atDeadline(time.Second).Priority}, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "shop", Name: "deadline"}})

	var got []string
	for range 8 {
		req, prio, _ := q.GetWithPriority()
		got = append(got, fmt.Sprintf("%s@%d", req.Name, prio))
		q.Done(req)
	}
	low := handler.LowPriority
	want := []string{"held-listed@10", "queued-listed@10", "acquired@10", "deadline@10", "created@0", "released@0",
		fmt.Sprintf("idle-listed@%d", low), fmt.Sprintf("resynced@%d", low)}
	if !slices.Equal(got, want) {
		t.Errorf("queue order %v, want %v", got, want)
	}
}
