package main

import (
	"context"
	"time"

	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	goredislib "github.com/redis/go-redis/v9"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// rawCAS is a baseline of raw resourceVersion CAS on objects of its own,
// made like kubelock's.
type rawCAS struct {
	key, system string
	locker      func(cfg *rest.Config, clients int) (locker, holdTarget, error)
}

var rawCASBaselines = []rawCAS{
	{"lease", sysLease, func(cfg *rest.Config, clients int) (locker, holdTarget, error) {
		ll, err := newLeaseLocker(cfg, leaseNS, clients)
		if err != nil {
			return nil, holdTarget{}, err
		}
		return ll, leaseHold(ll), nil
	}},
	{"crd", sysBare, func(cfg *rest.Config, clients int) (locker, holdTarget, error) {
		bl, err := newBareLocker(cfg, leaseNS, clients)
		if err != nil {
			return nil, holdTarget{}, err
		}
		return bl, bareHold(bl), nil
	}},
}

// runRawCAS runs the seed mix, holding and uncontended workloads on each
// selected raw CAS baseline: Leases and a bare custom resource.
func (b *benchRun) runRawCAS(ctx context.Context) error {
	for _, base := range rawCASBaselines {
		if !b.systems[base.key] || ctx.Err() != nil {
			continue
		}
		tr := newTrips()
		l, target, err := base.locker(tr.wrap(b.c.user), b.o.clients)
		if err != nil {
			return err
		}
		free := newPool(b.o.leaseObjects)
		if b.wl["1"] {
			m := b.mix
			m.objects = b.o.leaseObjects
			b.rep.mixes = append(b.rep.mixes, runSeedMix(ctx, b.c, l, base.system, free, m, b.pw, logf))
		}
		if b.wl["5"] {
			b.addHold(runHold(ctx, b.c, b.pw, base.system, false, free, b.hold, target))
		}
		if b.wl["2"] {
			b.rep.uncontended = append(b.rep.uncontended, runUncontendedBoth(ctx, b.c, l, base.system, free, b.uncRate, b.o, tr)...)
		}
	}
	return nil
}

// runElections runs the hand-off and expiry workloads on client-go's
// elector, on a Lease and on a DistributedLock, with the same timings.
func (b *benchRun) runElections(ctx context.Context) error {
	userCS, err := kubernetes.NewForConfig(b.c.user)
	if err != nil {
		return err
	}
	for _, le := range []struct {
		system, name string
		mutex        func(i int) (mutexFn, error)
		expiry       func(ctx context.Context, j int) (time.Duration, error)
	}{
		{"leaderelection", sysLE, leaderElectionMutex(userCS, "handoff-le"), leaderElectionExpiryTrial(userCS, "expiry-le")},
		{"kubelock-le", sysKLE, kubelockElectionMutex(b.c, "handoff-kle"), kubelockElectionExpiryTrial(b.c, "expiry-kle")},
	} {
		if !b.systems[le.system] || ctx.Err() != nil {
			continue
		}
		if b.wl["3"] {
			b.addHandoff(runHandoff(ctx, le.name, b.o.handoffK, b.o.handoffHold, b.o.stepWarmup, b.o.leMeasure, le.mutex))
		}
		if b.wl["4"] {
			b.addExpiry(runExpiry(ctx, le.name, b.o.expiryTrials, leLeaseDuration, le.expiry))
		}
	}
	return nil
}

// runEtcd runs the uncontended, hand-off and expiry workloads on etcd's
// concurrency.Mutex, on the cluster's etcd.
func (b *benchRun) runEtcd(ctx context.Context) error {
	if !b.systems["etcd"] || ctx.Err() != nil {
		return nil
	}
	o := b.o
	cli, err := newEtcdClient(b.c.etcdURL)
	if err != nil {
		return err
	}
	defer func() { _ = cli.Close() }()
	if b.wl["2"] {
		el, err := newEtcdLocker(cli, o.clients)
		if err != nil {
			return err
		}
		r := runUncontended(ctx, el, sysEtcd, newPool(o.locks), b.uncRate, o.stepWarmup, o.uncMeasure, o.maxInFlight, nil)
		el.close()
		b.addPlainUncontended(r)
	}
	if b.wl["3"] {
		var cleanup []func()
		r := runHandoff(ctx, sysEtcd, o.handoffK, o.handoffHold, o.stepWarmup, o.handoffMeasure, etcdMutex(cli, "/kubelock-bench/handoff", &cleanup))
		for _, f := range cleanup {
			f()
		}
		b.addHandoff(r)
	}
	if b.wl["4"] {
		ttl := max(1, int(o.expiryLease/time.Second))
		b.addExpiry(runExpiry(ctx, sysEtcd, o.expiryTrials, time.Duration(ttl)*time.Second, etcdExpiryTrial(cli, "/kubelock-bench/expiry", ttl)))
	}
	return nil
}

// runRedis runs the uncontended and hand-off workloads on redsync.
func (b *benchRun) runRedis(ctx context.Context) error {
	if !b.systems["redis"] || ctx.Err() != nil {
		return nil
	}
	o := b.o
	rc := goredislib.NewClient(&goredislib.Options{Addr: b.c.redisAddr})
	defer func() { _ = rc.Close() }()
	rs := redsync.New(goredis.NewPool(rc))
	if b.wl["2"] {
		b.addPlainUncontended(runUncontended(ctx, &redisLocker{rs: rs}, sysRedis, newPool(o.locks), b.uncRate, o.stepWarmup, o.uncMeasure, o.maxInFlight, nil))
	}
	if b.wl["3"] {
		b.addHandoff(runHandoff(ctx, sysRedis, o.handoffK, o.handoffHold, o.stepWarmup, o.handoffMeasure, redisMutex(rs, "kubelock-bench/handoff")))
	}
	return nil
}

// addPlainUncontended logs and reports an uncontended result of a system
// outside Kubernetes: its acquisitions only, no requests counted.
func (b *benchRun) addPlainUncontended(r *uncontendedResult) {
	logf("  %-16s uncontended: acquire p50 %v p99 %v, errors %d", r.System, r.Acquire.P50.Round(time.Millisecond), r.Acquire.P99.Round(time.Millisecond), r.Errors)
	b.rep.uncontended = append(b.rep.uncontended, r)
}
