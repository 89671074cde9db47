package main

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync/atomic"
	"time"

	"github.com/go-redsync/redsync/v4"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kubelock/kubelock/pkg/lock"
)

// locker takes uncontended locks by key (workloads 1 and 2).
type locker interface {
	acquire(ctx context.Context, key string) (holding, error)
}

// holding is one acquired lock.
type holding interface {
	renew(ctx context.Context) error
	release(ctx context.Context) error
}

// --- kubelock ------------------------------------------------------------------

// kubelockLocker is pkg/lock as users call it; renewal is driven by the
// benchmark (WithoutAutoRenew + Renew) so renewals are scheduled and measured.
type kubelockLocker struct {
	clients []*lock.Client
}

// clientFor is the client of n that takes key: always the same one, as a
// process takes its own keys, so that a lock taken again was seen before.
func clientFor(key string, n int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return int(h.Sum32() % uint32(n))
}

func newKubelockLocker(newClient lockClientFactory, cfg *rest.Config, ns string, n int, lease time.Duration) (*kubelockLocker, error) {
	k := &kubelockLocker{}
	for i := range n {
		c, err := newClient(cfg, lockClientOptions(i, ns, lease)...)
		if err != nil {
			return nil, err
		}
		k.clients = append(k.clients, c)
	}
	return k, nil
}

// lockClientOptions are the options of a locker's client i.
func lockClientOptions(i int, ns string, lease time.Duration) []lock.Option {
	return []lock.Option{lock.WithNamespace(ns), lock.WithIdentity(fmt.Sprintf("bench-%d", i)), lock.WithoutAutoRenew(), lock.WithLeaseDuration(lease)}
}

func (k *kubelockLocker) acquire(ctx context.Context, key string) (holding, error) {
	c := k.clients[clientFor(key, len(k.clients))]
	l, err := c.TryAcquire(ctx, key)
	if err != nil {
		return nil, err
	}
	return kubelockHolding{l}, nil
}

type kubelockHolding struct{ l *lock.Lock }

func (h kubelockHolding) renew(ctx context.Context) error   { return h.l.Renew(ctx) }
func (h kubelockHolding) release(ctx context.Context) error { return h.l.Release(ctx) }

// --- raw Lease CAS ---------------------------------------------------------------

// leaseLocker is the stack's limit: get-then-update resourceVersion CAS on
// coordination.k8s.io/v1 Leases, no admission, no controller. Renew and
// release reuse the object of the previous response, as kubelock does.
type leaseLocker struct {
	cs       []kubernetes.Interface
	ns       string
	identity string
}

func newLeaseLocker(cfg *rest.Config, ns string, n int) (*leaseLocker, error) {
	l := &leaseLocker{ns: ns, identity: "bench"}
	for range n {
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return nil, err
		}
		l.cs = append(l.cs, cs)
	}
	return l, nil
}

var errLeaseHeld = errors.New("lease is held")

func (l *leaseLocker) acquire(ctx context.Context, key string) (holding, error) {
	cs := l.cs[clientFor(key, len(l.cs))]
	api := cs.CoordinationV1().Leases(l.ns)
	obj, err := api.Get(ctx, key, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	if obj.Spec.HolderIdentity != nil && *obj.Spec.HolderIdentity != "" {
		return nil, errLeaseHeld
	}
	now := metav1.NowMicro()
	id, dur := l.identity, int32(30)
	obj.Spec.HolderIdentity, obj.Spec.LeaseDurationSeconds = &id, &dur
	obj.Spec.AcquireTime, obj.Spec.RenewTime = &now, &now
	t := int32(0)
	if obj.Spec.LeaseTransitions != nil {
		t = *obj.Spec.LeaseTransitions + 1
	}
	obj.Spec.LeaseTransitions = &t
	next, err := api.Update(ctx, obj, metav1.UpdateOptions{})
	if err != nil {
		return nil, err
	}
	return &leaseHolding{api: api, obj: next}, nil
}

type leaseHolding struct {
	api interface {
		Update(context.Context, *coordinationv1.Lease, metav1.UpdateOptions) (*coordinationv1.Lease, error)
	}
	obj *coordinationv1.Lease
}

func (h *leaseHolding) renew(ctx context.Context) error {
	o := h.obj.DeepCopy()
	now := metav1.NowMicro()
	o.Spec.RenewTime = &now
	next, err := h.api.Update(ctx, o, metav1.UpdateOptions{})
	if err != nil {
		return err
	}
	h.obj = next
	return nil
}

func (h *leaseHolding) release(ctx context.Context) error {
	o := h.obj.DeepCopy()
	o.Spec.HolderIdentity, o.Spec.AcquireTime, o.Spec.RenewTime = nil, nil, nil
	next, err := h.api.Update(ctx, o, metav1.UpdateOptions{})
	if err != nil {
		return err
	}
	h.obj = next
	return nil
}

// --- etcd concurrency.Mutex ------------------------------------------------------

// etcdLocker is etcd's own recipe: a Session (a lease kept alive) and a Mutex
// per key, on the same etcd the apiserver uses.
type etcdLocker struct {
	sessions []*concurrency.Session
	next     atomic.Uint64
}

func newEtcdClient(url string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
}

func newEtcdLocker(cli *clientv3.Client, n int) (*etcdLocker, error) {
	e := &etcdLocker{}
	for range n {
		s, err := concurrency.NewSession(cli, concurrency.WithTTL(30))
		if err != nil {
			return nil, err
		}
		e.sessions = append(e.sessions, s)
	}
	return e, nil
}

func (e *etcdLocker) close() {
	for _, s := range e.sessions {
		_ = s.Close()
	}
}

func (e *etcdLocker) acquire(ctx context.Context, key string) (holding, error) {
	s := e.sessions[e.next.Add(1)%uint64(len(e.sessions))]
	m := concurrency.NewMutex(s, "/kubelock-bench/"+key)
	if err := m.Lock(ctx); err != nil {
		return nil, err
	}
	return etcdHolding{m}, nil
}

type etcdHolding struct{ m *concurrency.Mutex }

func (h etcdHolding) renew(context.Context) error       { return nil } // the session keeps it alive
func (h etcdHolding) release(ctx context.Context) error { return h.m.Unlock(ctx) }

// --- redsync -------------------------------------------------------------------------

// redisLocker is redsync on one local redis-server (SET NX PX + Lua delete).
type redisLocker struct {
	rs *redsync.Redsync
}

func (r *redisLocker) acquire(ctx context.Context, key string) (holding, error) {
	m := r.rs.NewMutex("kubelock-bench/"+key, redsync.WithExpiry(30*time.Second))
	if err := m.LockContext(ctx); err != nil {
		return nil, err
	}
	return redisHolding{m}, nil
}

type redisHolding struct{ m *redsync.Mutex }

func (h redisHolding) renew(ctx context.Context) error {
	_, err := h.m.ExtendContext(ctx)
	return err
}

func (h redisHolding) release(ctx context.Context) error {
	_, err := h.m.UnlockContext(ctx)
	return err
}
