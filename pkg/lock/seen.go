package lock

import (
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/utils/lru"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// seenLocksLimit bounds how many locks' last seen objects a client keeps,
// the least recently used forgotten first.
const seenLocksLimit = 1024

// seenLocks is the last object a client saw of each lock: a write's
// response, a read or a watch event. An acquire starts from it and reads
// afresh only when it does not lead straight to the acquiring write, or when
// that write conflicts: when nothing contends, an acquire is one round trip.
// It is only ever a starting point: every write carries the object's
// resourceVersion as precondition, so a stale one costs a conflict, never a
// wrong holding.
type seenLocks struct{ c *lru.Cache }

func newSeenLocks(n int) seenLocks { return seenLocks{c: lru.New(n)} }

// saw records obj unless an object of the same lock with a newer
// resourceVersion was seen already.
func (s seenLocks) saw(obj *locksv1alpha1.DistributedLock) {
	if obj == nil || obj.ResourceVersion == "" {
		return
	}
	if prev, ok := s.get(obj.Name); ok && prev.UID == obj.UID {
		if c, err := resourceversion.CompareResourceVersion(obj.ResourceVersion, prev.ResourceVersion); err == nil && c < 0 {
			return
		}
	}
	s.c.Add(obj.Name, obj.DeepCopy())
}

// get is a copy of the last object seen of lock name.
func (s seenLocks) get(name string) (*locksv1alpha1.DistributedLock, bool) {
	v, ok := s.c.Get(name)
	if !ok {
		return nil, false
	}
	obj, _ := v.(*locksv1alpha1.DistributedLock) // saw adds only locks
	return obj.DeepCopy(), true
}

// forget drops what was seen of lock name (it was deleted).
func (s seenLocks) forget(name string) { s.c.Remove(name) }
