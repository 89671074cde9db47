// Package locksession is the lock apiserver's store of LockSessions and
// their status subresource.
package locksession

import (
	"context"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/generic"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/lockapiserver/lockrules"
	"github.com/kubelock/kubelock/lockapiserver/registry"
	"github.com/kubelock/kubelock/lockapiserver/validation"
)

type session = *locksv1alpha1.LockSession

var kind = registry.Kind[session]{
	Validate:       validation.ValidateSession,
	ValidateUpdate: validation.ValidateSessionUpdate,
	Meta:           func(s session) *metav1.ObjectMeta { return &s.ObjectMeta },
	ClearStatus:    func(s session) { s.Status = locksv1alpha1.LockSessionStatus{} },
	CopyStatus:     func(n, o session) { o.Status.DeepCopyInto(&n.Status) },
	CopySpec:       func(n, o session) { n.Spec = o.Spec },
	SameSpec:       func(n, o session) bool { return equality.Semantic.DeepEqual(n.Spec, o.Spec) },
}

// NewStorage returns the main endpoint and the status subresource, and
// lets rules read sessions from the store.
func NewStorage(scheme *runtime.Scheme, optsGetter generic.RESTOptionsGetter, rules *lockrules.Checker) (*registry.REST, *registry.StatusREST, error) {
	s, status := registry.Strategies(scheme, kind)
	main, st, err := registry.NewStorage(optsGetter, registry.Resource[session]{
		GroupResource:  lockrules.Sessions,
		New:            func() runtime.Object { return &locksv1alpha1.LockSession{} },
		NewList:        func() runtime.Object { return &locksv1alpha1.LockSessionList{} },
		Strategy:       s,
		StatusStrategy: status,
		Create:         rules.SessionCreate,
		Update:         rules.SessionUpdate,
		StatusUpdate:   rules.SessionStatusUpdate,
		Delete:         rules.SessionDelete,
	})
	if err != nil {
		return nil, nil, err
	}
	rules.ReadSessionsWith(func(ctx context.Context, namespace, name string) (*locksv1alpha1.LockSession, error) {
		// A quorum read: a client acquires right after it created its session.
		obj, err := main.Get(request.WithNamespace(ctx, namespace), name, &metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return nil, nil
		case err != nil:
			return nil, err
		}
		return obj.(session), nil //nolint:errcheck // the store holds only sessions
	})
	return main, st, nil
}
