package controllers

import (
	"context"
	"errors"

	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// A replica that does not lead keeps the controller's cache warm and
// observes every lock's and session's renewals, so that once it leads its
// controller starts at once, on a synced cache, and times each lease from
// the last renewal this replica saw, not from its takeover: a lease whose
// holder died with the old leader is overdue by the time the new one leads,
// instead of starting over. It is as safe as a leader's observation: a
// renewal is first seen on this replica's clock after the apiserver
// committed it, so a lease timed from there still ends after the holder's
// safe deadline (docs/design.md, "Time").

// warmCache runs the controller's cache on every replica from the manager's
// start, leader or not; a bare cache would start with leadership.
type warmCache struct{ cache.Cache }

// NeedLeaderElection implements manager.LeaderElectionRunnable.
func (warmCache) NeedLeaderElection() bool { return false }

// standbyObserver folds every version of a lock or a session the cache
// receives into the controller's observations, until this replica leads:
// from then on the controller folds them itself, and reports the
// transitions. It also starts the informer of pods, which the controller's
// first reconciles would otherwise wait for.
type standbyObserver struct {
	cache   cache.Cache
	r       *Reconciler
	elected <-chan struct{}
}

// NeedLeaderElection implements manager.LeaderElectionRunnable.
func (*standbyObserver) NeedLeaderElection() bool { return false }

// Start implements manager.Runnable.
func (s *standbyObserver) Start(ctx context.Context) error {
	handlers := map[client.Object]toolscache.ResourceEventHandler{
		&cachedLock{}:                s.handler(s.observeLock, s.r.obs.forget),
		&locksv1alpha1.LockSession{}: s.handler(s.observeSession, s.r.sessions.forget),
		podMetadata():                nil,
	}
	var stop []func() error
	for obj, h := range handlers {
		inf, err := s.cache.GetInformer(ctx, obj)
		if ctx.Err() != nil {
			return unregister(stop)
		}
		if err != nil {
			return errors.Join(err, unregister(stop))
		}
		if h == nil {
			continue
		}
		reg, err := inf.AddEventHandler(h)
		if err != nil {
			return errors.Join(err, unregister(stop))
		}
		stop = append(stop, func() error { return inf.RemoveEventHandler(reg) })
	}
	select {
	case <-ctx.Done():
	case <-s.elected:
	}
	return unregister(stop)
}

func unregister(stop []func() error) error {
	var errs []error
	for _, f := range stop {
		errs = append(errs, f())
	}
	return errors.Join(errs...)
}

// handler calls observe with each added or updated object, and forget with
// the key of each deleted one, while this replica does not lead.
func (s *standbyObserver) handler(observe func(client.Object), forget func(client.ObjectKey)) toolscache.ResourceEventHandler {
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.ifStandby(obj, observe) },
		UpdateFunc: func(_, obj any) { s.ifStandby(obj, observe) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			s.ifStandby(obj, func(o client.Object) { forget(client.ObjectKeyFromObject(o)) })
		},
	}
}

func (s *standbyObserver) ifStandby(obj any, f func(client.Object)) {
	o, ok := obj.(client.Object)
	select {
	case <-s.elected:
	default:
		if ok {
			f(o)
		}
	}
}

// observeLock folds a lock as the cache received it; one that does not
// decode is left to the controller, as Reconcile leaves it.
func (s *standbyObserver) observeLock(o client.Object) {
	l, ok := o.(*cachedLock)
	if !ok || l.undecodable != "" || l.received.IsZero() {
		return
	}
	s.r.obs.observeStandby(client.ObjectKeyFromObject(l), &l.DistributedLock, l.received)
}

// observeSession folds a session as Reconcile does, now.
func (s *standbyObserver) observeSession(o client.Object) {
	if ls, ok := o.(*locksv1alpha1.LockSession); ok {
		s.r.sessions.observe(ls, s.r.clock.Now())
	}
}
