package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"

	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/lockapi"
)

// Names of the lock apiserver backend's processes: lockAPIProc starts every
// replica's (replicaName), lockStoreProc is the lock store, their etcd.
const (
	lockAPIProc   = "kubelock-apiserver"
	lockStoreProc = "lock etcd"
)

// lockBackend is kubelock's lock apiserver backend as a system of the run: a
// control plane of its own, because a group version is served by the CRD or
// by an APIService, never both, so it cannot share the CRD's kube-apiserver;
// kubelock-apiserver registered there by an APIService, serving from an etcd
// of its own, and the replicas the scale model adds on that same etcd. No
// operator runs there: the workloads it runs need none.
type lockBackend struct {
	c       *cluster // its kube-apiserver as the workloads see it
	bin     string
	servers []*lockapi.Server
	groups  []*cpuCgroup // the scale model's, one per replica
	pw      *procWatch   // kube-apiserver, its etcd, the replicas, the lock store
	objects int          // seed-mix locks created
	free    pool         // of them, shared by every workload on it
}

// startLockBackend starts the control plane and the first kubelock-apiserver
// with its files in dir, registers it and creates n seed-mix locks through
// kube-apiserver.
func startLockBackend(ctx context.Context, dir string, n int) (lb *lockBackend, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	lb = &lockBackend{c: &cluster{dir: dir, logf: logf}}
	defer func() {
		if err != nil {
			lb.stop()
		}
	}()
	logf("lock apiserver backend: a control plane of its own (aggregation layer on, no lock CRDs), kubelock-apiserver and its etcd")
	env, err := lockapi.ControlPlane()
	if err != nil {
		return lb, err
	}
	if err := lb.c.connect(ctx, env); err != nil {
		return lb, err
	}
	kube := clusterPath(env)
	lb.pw = &procWatch{procs: []proc{kube[roleKube], kube[roleEtcd]}}
	if lb.bin, err = lockapi.Build(ctx, dir); err != nil {
		return lb, err
	}
	s, err := lb.addReplica(ctx)
	if err != nil {
		return lb, err
	}
	if err := s.Register(ctx, env); err != nil {
		return lb, err
	}
	d, err := createLocks(ctx, env.Client, n)
	if err != nil {
		return lb, err
	}
	lb.objects, lb.free = n, newPool(n)
	logf("created %d DistributedLocks through the APIService in %s (%.0f/s)", n, d.Round(time.Millisecond), float64(n)/d.Seconds())
	return lb, nil
}

// addReplica starts one more kubelock-apiserver: the first with an etcd of
// its own (the lock store), every other one on that etcd.
func (lb *lockBackend) addReplica(ctx context.Context) (*lockapi.Server, error) {
	// The operator (workloads 5 and scale) runs as controllerUser.
	o := lockapi.Options{Name: replicaName(len(lb.servers) + 1), ControllerUsers: []string{controllerUser}}
	if len(lb.servers) > 0 {
		o.Store = lb.servers[0].Etcd
	}
	s, err := lockapi.Start(ctx, lb.c.env, lb.bin, lb.c.dir, o)
	if err != nil {
		return nil, err
	}
	lb.servers = append(lb.servers, s)
	lb.pw.procs = append(lb.pw.procs, proc{name: s.Name, pid: s.APIServer.Pid()})
	if o.Store == nil {
		lb.pw.procs = append(lb.pw.procs, proc{name: lockStoreProc, pid: s.Etcd.Members[0].Running().Pid()})
	}
	logf("  %s: pid %d at %s", s.Name, s.APIServer.Pid(), s.URL())
	return s, nil
}

// replicaName is the i-th replica's (from 1), as a process of the report.
func replicaName(i int) string { return fmt.Sprintf("%s-%d", lockAPIProc, i) }

// stop stops the replicas (the first last: its etcd is everyone's store),
// then the control plane, and removes the cgroups they ran in.
func (lb *lockBackend) stop() {
	for i := len(lb.servers) - 1; i >= 0; i-- {
		_ = lb.servers[i].Stop()
	}
	lb.c.stop()
	for _, g := range lb.groups {
		if err := g.remove(); err != nil {
			logf("removing cgroup %s: %v", g.dir, err)
		}
	}
}

// lockPath is one way pkg/lock's clients reach the lock apiserver backend:
// as a system of the run, with the clients it builds.
type lockPath struct {
	key, name string
	clients   lockClientFactory
}

// paths are the backend's systems: through kube-apiserver, which proxies
// to the APIService, and straight to its first replica, as a client of the
// Service would.
func (lb *lockBackend) paths() []lockPath {
	return []lockPath{
		{"apiserver", sysAPIServer, lockClients(encJSON, nil)},
		{"apiserver-direct", sysAPIServerDirect, directClients(lb.servers[0])},
	}
}

// runAPIServer runs the lock apiserver backend's workloads (the seed mix,
// uncontended acquisitions, hand-off) on each selected path and, with
// --scale-model, the scale model.
func (b *benchRun) runAPIServer(ctx context.Context) error {
	if (!b.systems["apiserver"] && !b.systems["apiserver-direct"] && !b.o.scaleModel) || ctx.Err() != nil {
		return nil
	}
	lb, err := startLockBackend(ctx, filepath.Join(b.c.dir, "lock-backend"), b.o.leaseObjects)
	if err != nil {
		return fmt.Errorf("the lock apiserver backend: %w", err)
	}
	defer lb.stop()
	for _, p := range lb.paths() {
		if !b.systems[p.key] || ctx.Err() != nil {
			continue
		}
		if err := b.lockBackendWorkloads(ctx, lb, p); err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
	}
	// Before the scale model, which leaves its replicas held to their
	// quotas; that model then runs on a store of --locks objects.
	if err := b.lockBackendOperated(ctx, lb); err != nil {
		return err
	}
	if b.o.scaleModel && ctx.Err() == nil {
		b.rep.replicas = b.scaleModel(ctx, lb)
	}
	return nil
}

// lockBackendOperated runs, with the operator on the lock apiserver
// backend's control plane, workload 5 (holding, without and with sessions)
// on each selected path, and workload scale with the run's --locks through
// kube-apiserver, then times a replica started at that scale.
func (b *benchRun) lockBackendOperated(ctx context.Context, lb *lockBackend) error {
	atScale := b.wl["scale"] && b.systems["apiserver"]
	if (!b.wl["5"] && !atScale) || ctx.Err() != nil {
		return nil
	}
	if err := lb.c.startManager(ctx); err != nil {
		return fmt.Errorf("the operator on the lock apiserver backend: %w", err)
	}
	// Stopped after, so that its reconciles of every write do not weigh
	// on the scale model.
	defer func() {
		if err := lb.c.stopManager(); err != nil {
			logf("stopping the operator on the lock apiserver backend: %v", err)
		}
	}()
	if b.wl["5"] {
		for _, p := range lb.paths() {
			for _, sessions := range []bool{false, true} {
				if !b.systems[p.key] || ctx.Err() != nil {
					continue
				}
				t, err := kubelockHold(ctx, p.clients, lb.c.user, lockNS, b.hold, sessions)
				if err != nil {
					return fmt.Errorf("%s: %w", p.name, err)
				}
				b.addHold(runHold(ctx, lb.c, lb.pw, p.name, sessions, lb.free, b.hold, t))
			}
		}
	}
	if !atScale || ctx.Err() != nil {
		return nil
	}
	if err := lb.grow(ctx, b.o.locks); err != nil {
		return err
	}
	first := lb.servers[0]
	store := []proc{{name: first.Name, pid: first.APIServer.Pid()}, {name: lockStoreProc, pid: first.Etcd.Members[0].Running().Pid()}}
	res := runScale(ctx, lb.c, "the lock apiserver", lb.free, b.scaleConfig(), store, logf)
	if res.Err == "" && ctx.Err() == nil {
		started := time.Now()
		s, err := lb.addReplica(ctx)
		if err != nil {
			return fmt.Errorf("a replica at %d locks: %w", b.o.locks, err)
		}
		res.NewReplica = time.Since(started)
		res.NewReplicaMem = procMem{Name: s.Name}
		res.NewReplicaMem.RSS, res.NewReplicaMem.Peak = proc{pid: s.APIServer.Pid()}.mem()
		logf("  scale: a replica started at %d locks served after %s, RSS %s", b.o.locks, res.NewReplica.Round(time.Millisecond), mib(res.NewReplicaMem.RSS))
		// The scale model starts its own replicas.
		lb.servers, lb.pw.procs = lb.servers[:len(lb.servers)-1], lb.pw.procs[:len(lb.pw.procs)-1]
		if err := s.Stop(); err != nil {
			logf("stopping %s: %v", s.Name, err)
		}
	}
	b.rep.scales = append(b.rep.scales, res)
	return nil
}

// grow creates DistributedLocks through kube-apiserver until n exist, and
// hands out the new ones with those still free.
func (lb *lockBackend) grow(ctx context.Context, n int) error {
	if n <= lb.objects {
		return nil
	}
	d, err := createLocks(ctx, lb.c.env.Client, n)
	if err != nil {
		return err
	}
	logf("grew the lock apiserver backend to %d DistributedLocks in %s (%.0f/s)", n, d.Round(time.Millisecond), float64(n-lb.objects)/d.Seconds())
	free := make(pool, n)
	for i, ok := lb.free.take(); ok; i, ok = lb.free.take() {
		free <- i
	}
	for i := lb.objects; i < n; i++ {
		free <- i
	}
	lb.objects, lb.free = n, free
	return nil
}

// lockBackendWorkloads runs workloads 1, 2 and 3 with pkg/lock's clients
// on path p. Expiry (workload 4) is the controller's, which does not run
// here.
func (b *benchRun) lockBackendWorkloads(ctx context.Context, lb *lockBackend, p lockPath) error {
	tr := newTrips()
	l, err := newKubelockLocker(p.clients, tr.wrap(lb.c.user), lockNS, b.o.clients, b.o.lease)
	if err != nil {
		return err
	}
	if b.wl["1"] {
		m := b.mix
		m.objects = lb.objects
		b.rep.mixes = append(b.rep.mixes, runSeedMix(ctx, lb.c, l, p.name, lb.free, m, lb.pw, logf))
	}
	if b.wl["2"] {
		b.rep.uncontended = append(b.rep.uncontended, runUncontendedBoth(ctx, lb.c, l, p.name, lb.free, b.uncRate, b.o, tr)...)
	}
	if b.wl["3"] {
		return b.handoffOn(ctx, lb.c, "handoff-"+p.key, p.name, p.clients)
	}
	return nil
}

// directLocker is pkg/lock with n clients, client i talking straight to
// servers[i mod len(servers)], as clients spread over a Service's endpoints.
func directLocker(ctx context.Context, kube *rest.Config, servers []*lockapi.Server, n int, lease time.Duration) (*kubelockLocker, error) {
	k := &kubelockLocker{}
	for i := range n {
		c, err := directLockClient(kube, servers[i%len(servers)], lockClientOptions(i, lockNS, lease)...)
		if err != nil {
			return nil, err
		}
		if err := warm(ctx, c); err != nil {
			return nil, fmt.Errorf("%s: %w", servers[i%len(servers)].Name, err)
		}
		k.clients = append(k.clients, c)
	}
	return k, nil
}

// directClients builds pkg/lock clients that talk straight to s, from the
// configuration of kube-apiserver's user.
func directClients(s *lockapi.Server) lockClientFactory {
	return func(kube *rest.Config, opts ...lock.Option) (*lock.Client, error) {
		return directLockClient(kube, s, opts...)
	}
}

// warm reads a lock with c until it can, so that c has learned the
// server's API (its first request asks for discovery, which a replica just
// started may still refuse) before any request is timed.
func warm(ctx context.Context, c *lock.Client) error {
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := c.Get(ctx, lockName(0))
		return err == nil, nil
	})
}

// directLockClient is a pkg/lock client whose lock requests go straight to
// s (lock.NewDirect).
func directLockClient(kube *rest.Config, s *lockapi.Server, opts ...lock.Option) (*lock.Client, error) {
	return lock.NewDirect(kube, s.Direct(kube), opts...)
}
