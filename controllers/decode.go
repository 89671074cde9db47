package controllers

import (
	"context"
	"errors"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/log"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/internal/metrics"
)

// readLock reads the lock at key from r.reader (cache.go: decoded object by
// object) with when the cache received it (zero if unknown). ok is false
// (with a nil error) when the object exists but does not decode: it was
// logged and counted once for its resourceVersion, and the controller leaves
// it alone.
func (r *Reconciler) readLock(ctx context.Context, key types.NamespacedName) (lock *locksv1alpha1.DistributedLock, received time.Time, ok bool, err error) {
	c := &cachedLock{}
	if err := r.reader.Get(ctx, key, c); err != nil {
		return nil, time.Time{}, false, err
	}
	if c.undecodable != "" {
		if r.malformed.first(key, c.ResourceVersion) {
			metrics.LockDecodeErrors.WithLabelValues(key.Namespace).Inc()
			log.FromContext(ctx).Error(errors.New(c.undecodable), "lock cannot be decoded; leaving it alone until it is fixed or deleted",
				"lock", key, "resourceVersion", c.ResourceVersion)
		}
		return nil, time.Time{}, false, nil
	}
	r.malformed.forget(key)
	return &c.DistributedLock, c.received, true, nil
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
