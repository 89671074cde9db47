// Package distributedlock is the lock apiserver's store of DistributedLocks
// and their status subresource.
package distributedlock

import (
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/registry/generic"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/lockapiserver/lockrules"
	"github.com/kubelock/kubelock/lockapiserver/registry"
	"github.com/kubelock/kubelock/lockapiserver/validation"
)

type lock = *locksv1alpha1.DistributedLock

var kind = registry.Kind[lock]{
	Validate:       validation.ValidateLock,
	ValidateUpdate: validation.ValidateLockUpdate,
	Meta:           func(l lock) *metav1.ObjectMeta { return &l.ObjectMeta },
	ClearStatus:    func(l lock) { l.Status = locksv1alpha1.DistributedLockStatus{} },
	CopyStatus:     func(n, o lock) { o.Status.DeepCopyInto(&n.Status) },
	CopySpec:       func(n, o lock) { o.Spec.DeepCopyInto(&n.Spec) },
	SameSpec:       func(n, o lock) bool { return equality.Semantic.DeepEqual(n.Spec, o.Spec) },
}

// NewStorage returns the main endpoint and the status subresource.
func NewStorage(scheme *runtime.Scheme, optsGetter generic.RESTOptionsGetter, rules *lockrules.Checker) (*registry.REST, *registry.StatusREST, error) {
	s, status := registry.Strategies(scheme, kind)
	return registry.NewStorage(optsGetter, registry.Resource[lock]{
		GroupResource:  lockrules.Locks,
		New:            func() runtime.Object { return &locksv1alpha1.DistributedLock{} },
		NewList:        func() runtime.Object { return &locksv1alpha1.DistributedLockList{} },
		Strategy:       s,
		StatusStrategy: status,
		Create:         rules.LockCreate,
		Update:         rules.LockUpdate,
		StatusUpdate:   rules.LockStatusUpdate,
		Delete:         rules.LockDelete,
	})
}
