package controllers

import (
	"context"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// StandbyControllerName names the controller SetupStandby registers.
const StandbyControllerName = "distributedlock-standby"

// SetupStandby registers with mgr a reconciler of the one lock key that runs
// on every replica until the replica leads: for the lock the operator's own
// replicas elect their leader on (cmd/manager/operator's
// --leader-election-lock=kubelock). Setup's controller runs only on the
// leader, so without this nobody would expire a dead leader's holding or drop
// a dead candidate at the head of the queue, and no standby could take over.
//
// It decides exactly as Setup's controller does (the same Reconcile: expiry
// once no renewal was observed on this replica's clock for the lease plus the
// grace, waiter deadlines, the hand-off timeout) from a cache of that one
// object, and acts through the same admission rules, as the controller's user.
// Several standbys acting on one lock is safe: every write carries the
// resourceVersion its decision was made on. Once this replica leads,
// Setup's controller covers the lock and this one stands aside. Transitions it
// observes count in this replica's metrics and Events, leadership does not.
func SetupStandby(mgr ctrl.Manager, key types.NamespacedName, opts ...Option) error {
	r, err := newReconciler(mgr, opts)
	if err != nil {
		return err
	}
	c, err := newCache(mgr, cache.Options{
		DefaultNamespaces: map[string]cache.Config{key.Namespace: {}},
		ByObject: map[client.Object]cache.ByObject{
			&cachedLock{}: {Field: fields.OneTermEqualSelector("metadata.name", key.Name)},
		},
	}, r.clock)
	if err != nil {
		return err
	}
	if err := mgr.Add(standbyCache{c}); err != nil {
		return err
	}
	r.reader = c
	ctl, err := controller.New(StandbyControllerName, mgr, controller.Options{
		Reconciler:         &standby{Reconciler: r, elected: mgr.Elected()},
		NeedLeaderElection: ptr.To(false),
		SkipNameValidation: r.ctrlOpts.SkipNameValidation,
	})
	if err != nil {
		return err
	}
	return ctl.Watch(source.Kind(c, &cachedLock{}, &handler.TypedEnqueueRequestForObject[*cachedLock]{}))
}

// standbyCache makes the manager start the standby's cache with the others,
// on every replica and before the leader election (a bare cache would count
// as a runnable that needs leadership).
type standbyCache struct{ cache.Cache }

func (s standbyCache) GetCache() cache.Cache { return s.Cache }

// standby reconciles until this replica is elected.
type standby struct {
	*Reconciler
	elected <-chan struct{}
}

func (s *standby) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	select {
	case <-s.elected:
		return ctrl.Result{}, nil
	default:
		return s.Reconciler.Reconcile(ctx, req)
	}
}
