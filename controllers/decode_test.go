package controllers

import (
	"context"
	"fmt"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
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

// readLock decodes a well-formed lock and reports a malformed one as not ok,
// without an error: the reconcile ends there and nothing is retried.
func TestReadLockDecodesEachObjectOnItsOwn(t *testing.T) {
	good, bad := newUnstructuredLock(), newUnstructuredLock()
	good.SetNamespace("ns")
	good.SetName("good")
	bad.SetNamespace("ns")
	bad.SetName("bad")
	bad.SetResourceVersion("7")
	bad.Object["status"] = map[string]any{"waiters": []any{map[string]any{
		"identity": "w", "user": "u", "requestID": "r",
		"enqueueTime": "2026-01-01T00:00:00Z", "deadline": "2026-01-01T00:00:00.000000Z",
	}}}
	r := &Reconciler{reader: cacheOf{good, bad}}
	lock, ok, err := r.readLock(context.Background(), client.ObjectKeyFromObject(good))
	if err != nil || !ok || lock.Name != "good" {
		t.Fatalf("good lock: got %v, %v, %v", lock, ok, err)
	}
	lock, ok, err = r.readLock(context.Background(), client.ObjectKeyFromObject(bad))
	if err != nil || ok || lock != nil {
		t.Fatalf("malformed lock: got %v, %v, %v; want nil, false, nil", lock, ok, err)
	}
	if m, _ := r.malformed.rv.Load(client.ObjectKeyFromObject(bad)); m != "7" {
		t.Errorf("the malformed version is remembered as %v, want 7", m)
	}
	if _, _, err := r.readLock(context.Background(), types.NamespacedName{Namespace: "ns", Name: "gone"}); !apierrors.IsNotFound(err) {
		t.Errorf("a missing lock: got %v, want NotFound", err)
	}
}

// cacheOf reads unstructured objects as an informer cache holds them: a
// typed fake client would refuse to store a malformed one.
type cacheOf []*unstructured.Unstructured

func (c cacheOf) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	out, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return fmt.Errorf("cacheOf holds unstructured objects, not %T", obj)
	}
	for _, u := range c {
		if client.ObjectKeyFromObject(u) == key {
			u.DeepCopyInto(out)
			return nil
		}
	}
	return apierrors.NewNotFound(schema.GroupResource{Group: lockGVK.Group, Resource: "distributedlocks"}, key.Name)
}

func (cacheOf) List(context.Context, client.ObjectList, ...client.ListOption) error { return nil }
