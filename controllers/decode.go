package controllers

import (
	"context"
	"sync"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/log"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/internal/metrics"
)

// The controller watches and caches locks as unstructured objects and decodes
// each one on its own in Reconcile. A typed informer decodes the whole LIST
// (and each watch event) at once, so a single object that the Go types cannot
// read — a time the CRD's date-time format admits but metav1.MicroTime does
// not parse — would stop the cache, and with it the expiry of every lock.

// lockGVK is the kind the controller watches.
var lockGVK = locksv1alpha1.GroupVersion.WithKind("DistributedLock")

// newUnstructuredLock is an empty unstructured DistributedLock, for the cache.
func newUnstructuredLock() *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(lockGVK)
	return u
}

// readLock reads the lock at key from r.reader and decodes it. ok is false
// (with a nil error) when the object exists but does not decode: it was logged
// and counted once for its resourceVersion, and the controller leaves it alone.
func (r *Reconciler) readLock(ctx context.Context, key types.NamespacedName) (lock *locksv1alpha1.DistributedLock, ok bool, err error) {
	u := newUnstructuredLock()
	if err := r.reader.Get(ctx, key, u); err != nil {
		return nil, false, err
	}
	lock = &locksv1alpha1.DistributedLock{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.UnstructuredContent(), lock); err != nil {
		if r.malformed.first(key, u.GetResourceVersion()) {
			metrics.LockDecodeErrors.WithLabelValues(key.Namespace).Inc()
			log.FromContext(ctx).Error(err, "lock cannot be decoded; leaving it alone until it is fixed or deleted",
				"lock", key, "resourceVersion", u.GetResourceVersion())
		}
		return nil, false, nil
	}
	r.malformed.forget(key)
	return lock, true, nil
}

// malformedLocks remembers the resourceVersion at which each lock last failed
// to decode (types.NamespacedName → string), so that each malformed version
// is logged and counted once.
type malformedLocks struct{ rv sync.Map }

// first records that key failed to decode at resourceVersion rv and reports
// whether that version is new.
func (m *malformedLocks) first(key types.NamespacedName, rv string) bool {
	seen, ok := m.rv.Swap(key, rv)
	return !ok || seen != rv
}

// forget drops key, once it decodes again or is gone.
func (m *malformedLocks) forget(key types.NamespacedName) { m.rv.Delete(key) }
