package controllers

import (
	"context"
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

func TestMalformedLocksCountsEachVersionOnce(t *testing.T) {
	var m malformedLocks
	key := types.NamespacedName{Namespace: "ns", Name: "l"}
	for i, c := range []struct {
		rv   string
		want bool
	}{{"1", true}, {"1", false}, {"2", true}, {"2", false}} {
		if got := m.first(key, c.rv); got != c.want {
			t.Errorf("step %d: first(%s) = %v, want %v", i, c.rv, got, c.want)
		}
	}
	m.forget(key)
	if !m.first(key, "2") {
		t.Errorf("after forget, the same version is new again")
	}
}

// A lock as the apiserver serves it, with a waiter's enqueueTime set to t.
func lockJSON(name, rv, enqueueTime string) string {
	return fmt.Sprintf(`{"apiVersion":"locks.kubelock.io/v1alpha1","kind":"DistributedLock",
		"metadata":{"name":%q,"namespace":"ns","uid":"uid-%s","resourceVersion":%q,"labels":{"a":"b"}},
		"spec":{"type":"Mutex","leaseDurationSeconds":30},
		"status":{"fencingToken":7,"waiters":[{"identity":"w","user":"u","requestID":"r",
		"enqueueTime":%q,"deadline":"2026-01-01T00:00:00.000000Z"}]}}`, name, name, rv, enqueueTime)
}

// The cache's scheme decodes a LIST (and so a watch event) object by object:
// a lock the Go types cannot read keeps its metadata and the error, and the
// others decode whole.
func TestCacheDecodesEachLockOnItsOwn(t *testing.T) {
	s, err := cacheScheme()
	if err != nil {
		t.Fatal(err)
	}
	codec := serializer.NewCodecFactory(s).UniversalDeserializer()
	list := `{"apiVersion":"locks.kubelock.io/v1alpha1","kind":"DistributedLockList","metadata":{"resourceVersion":"9"},"items":[` +
		lockJSON("good", "5", "2026-01-01T00:00:00.000000Z") + "," +
		lockJSON("bad", "7", "2026-01-01T00:00:00Z") + // no microseconds: the CRD admits it, MicroTime does not
		`]}`
	obj, _, err := codec.Decode([]byte(list), nil, nil)
	if err != nil {
		t.Fatalf("decoding a list with one malformed lock: %v", err)
	}
	l, ok := obj.(*cachedLockList)
	if !ok || len(l.Items) != 2 {
		t.Fatalf("decoded %T with %v", obj, obj)
	}
	good, bad := l.Items[0], l.Items[1]
	if good.undecodable != "" || good.Status.FencingToken != 7 || len(good.Status.Waiters) != 1 || good.Spec.LeaseDurationSeconds != 30 {
		t.Errorf("the well-formed lock did not decode whole: %+v", good)
	}
	if bad.undecodable == "" || bad.Name != "bad" || bad.ResourceVersion != "7" || bad.UID != "uid-bad" || bad.Labels["a"] != "b" || bad.Status.FencingToken != 0 {
		t.Errorf("the malformed lock: got %+v (error %q), want its metadata only and the error", bad.DistributedLock, bad.undecodable)
	}
	if got := bad.deepCopy(); got.undecodable != bad.undecodable {
		t.Errorf("DeepCopyObject lost the decoding error")
	}

	one, _, err := codec.Decode([]byte(lockJSON("bad", "8", "2026-01-01t00:00:00.000000Z")), nil, nil)
	if err != nil {
		t.Fatalf("decoding one malformed lock (a watch event's object): %v", err)
	}
	if c, ok := one.(*cachedLock); !ok || c.undecodable == "" || c.ResourceVersion != "8" {
		t.Errorf("one malformed lock: got %#v", one)
	}
	if _, _, err := codec.Decode([]byte(`{"apiVersion":"locks.kubelock.io/v1alpha1","kind":"DistributedLock","metadata":{"name":7}}`), nil, nil); err == nil {
		t.Errorf("an object whose metadata does not decode either was accepted")
	}
}

// readLock returns a well-formed lock and reports a malformed one as not ok,
// without an error: the reconcile ends there and nothing is retried.
func TestReadLockLeavesMalformedLocksAlone(t *testing.T) {
	arrived := time.Now()
	good, bad := &cachedLock{received: arrived}, &cachedLock{undecodable: "parsing time"}
	good.Namespace, good.Name = "ns", "good"
	bad.Namespace, bad.Name, bad.ResourceVersion = "ns", "bad", "7"
	r := &Reconciler{reader: cacheOf{good, bad}}
	lock, received, ok, err := r.readLock(context.Background(), client.ObjectKeyFromObject(good))
	if err != nil || !ok || lock.Name != "good" || !received.Equal(arrived) {
		t.Fatalf("good lock: got %v, received %v, %v, %v", lock, received, ok, err)
	}
	lock, _, ok, err = r.readLock(context.Background(), client.ObjectKeyFromObject(bad))
	if err != nil || ok || lock != nil {
		t.Fatalf("malformed lock: got %v, %v, %v; want nil, false, nil", lock, ok, err)
	}
	if m, _ := r.malformed.rv.Load(client.ObjectKeyFromObject(bad)); m != "7" {
		t.Errorf("the malformed version is remembered as %v, want 7", m)
	}
	if _, _, _, err := r.readLock(context.Background(), types.NamespacedName{Namespace: "ns", Name: "gone"}); !apierrors.IsNotFound(err) {
		t.Errorf("a missing lock: got %v, want NotFound", err)
	}
}

// cacheOf reads cachedLocks as the controller's cache holds them: a typed
// fake client would refuse to store a malformed one.
type cacheOf []*cachedLock

func (c cacheOf) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	out, ok := obj.(*cachedLock)
	if !ok {
		return fmt.Errorf("cacheOf holds cachedLocks, not %T", obj)
	}
	for _, l := range c {
		if client.ObjectKeyFromObject(l) == key {
			*out = *l.deepCopy()
			return nil
		}
	}
	return apierrors.NewNotFound(schema.GroupResource{Group: lockGVK.Group, Resource: "distributedlocks"}, key.Name)
}

func (cacheOf) List(context.Context, client.ObjectList, ...client.ListOption) error { return nil }

// A holding's lease runs from when the cache received the version that
// carried its last renewal, not from when the reconcile got to it: a lock
// that waited behind a backlog is requeued for the same moment, ahead of
// the work that delayed it.
func TestReconcileTimesLeasesFromArrival(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	const grace = 2 * time.Second
	for _, tc := range []struct {
		name     string
		received time.Time
		want     time.Duration
	}{
		{"received 10s before the reconcile", now.Add(-10 * time.Second), 30*time.Second + grace - 10*time.Second},
		{"not received through the cache", time.Time{}, 30*time.Second + grace},
		{"received later than the controller's clock says now", now.Add(time.Second), 30*time.Second + grace},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLock(held("lease-1", 30, clientTime))
			// The status the controller would keep, so that it has nothing to write.
			l = desiredStatus(l, decision{}, "", now)
			r := &Reconciler{reader: cacheOf{{DistributedLock: *l, received: tc.received}}, clock: clocktesting.NewFakePassiveClock(now),
				timing: timing{grace: grace, idleTimeout: time.Hour}, events: EventsImportant}
			res, err := r.Reconcile(context.Background(), reconcile.Request{NamespacedName: client.ObjectKeyFromObject(l)})
			if err != nil {
				t.Fatal(err)
			}
			if res.RequeueAfter != tc.want || res.Priority == nil || *res.Priority != deadlinePriority {
				t.Errorf("got requeue after %s at priority %v, want %s at %d", res.RequeueAfter, res.Priority, tc.want, deadlinePriority)
			}
		})
	}
}
