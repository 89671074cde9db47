package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redsync/redsync/v4"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
	kle "github.com/kubelock/kubelock/pkg/lock/leaderelection"
)

// client-go's documented defaults ("core clients default this value to ..."),
// which controller-runtime's manager also uses.
const (
	leLeaseDuration = 15 * time.Second
	leRenewDeadline = 10 * time.Second
	leRetryPeriod   = 2 * time.Second
)

// --- workload 2: uncontended acquire + release ------------------------------------

type uncontendedResult struct {
	System           string
	Rate             float64
	Acquire, Release dist
	Pairs            float64 // completed acquire+release pairs/s
	Errors           int
	ErrKinds         map[string]int
	Rounds           int // > 1: measured in rounds alternating with other systems
	// Again: the locks were taken before by the same client (againLocks of
	// them in turn); otherwise each acquire is the first of its lock.
	Again bool
	// Trips: the apiserver requests per acquire and per release, as the
	// system's clients sent them (warm-up included).
	Trips []tripLine

	acq, rel *recorder
	pairs    int
	tr       *trips // counts the requests of the system's clients, when they were built with it
}

// kind names the run: first acquisitions, or again.
func (u *uncontendedResult) kind() string {
	if u.Again {
		return "again"
	}
	return "first"
}

// againLocks is how many locks workload 2's second run takes in turn, so
// that every lock is taken again within the warm-up (at least rate x warm-up
// acquisitions: 40 in --quick) and the measured acquisitions are repeats.
const againLocks = 24

// runUncontendedAgain is workload 2 on againLocks locks of free taken over
// and over, each by its own client (clientFor): a client that takes a lock
// it saw before may write straight away, where the first acquisition of a
// lock (runUncontended on the whole pool) must read it.
func runUncontendedAgain(ctx context.Context, sys locker, name string, free pool, rate float64, warmup, measure time.Duration, maxInFlight int, tr *trips) *uncontendedResult {
	again := make(pool, againLocks)
	for range againLocks {
		i, ok := free.take()
		if !ok {
			return &uncontendedResult{System: name, Again: true, ErrKinds: map[string]int{"no free lock object left": 1}, Errors: 1}
		}
		again <- i
	}
	defer func() {
		for range againLocks {
			free <- <-again
		}
	}()
	r := runUncontended(ctx, sys, name, again, rate, warmup, measure, maxInFlight, tr)
	r.Again = true
	return r
}

// runUncontended takes a free lock and gives it back at a fixed rate, open
// loop. tr counts the requests of sys's clients when they were built with it.
func runUncontended(ctx context.Context, sys locker, name string, free pool, rate float64, warmup, measure time.Duration, maxInFlight int, tr *trips) *uncontendedResult {
	u := newUncontended(name, rate)
	u.tr = tr
	ws := time.Now().Add(warmup)
	u.loop(ctx, sys, free, ws, ws.Add(measure), maxInFlight)
	return u.result(measure)
}

// runUncontendedInterleaved measures several systems (the same engine over
// different encodings) in alternating rounds, each system's warm-up first,
// so that a machine whose load drifts affects them alike.
func runUncontendedInterleaved(ctx context.Context, syss []locker, names []string, free pool, rate float64, warmup, measure time.Duration, rounds, maxInFlight int) []*uncontendedResult {
	us := make([]*uncontendedResult, len(syss))
	for i := range syss {
		us[i] = newUncontended(names[i], rate)
		// Warm-up: connections and caches, nothing recorded.
		now := time.Now()
		us[i].loop(ctx, syss[i], free, now.Add(warmup), now.Add(warmup), maxInFlight)
	}
	per := measure / time.Duration(max(1, rounds))
	for r := range max(1, rounds) {
		for k := range syss {
			i := (k + r) % len(syss) // alternate who goes first
			now := time.Now()
			us[i].loop(ctx, syss[i], free, now, now.Add(per), maxInFlight)
		}
	}
	for _, u := range us {
		u.Rounds = max(1, rounds)
	}
	out := make([]*uncontendedResult, len(us))
	for i, u := range us {
		out[i] = u.result(per * time.Duration(max(1, rounds)))
	}
	return out
}

func newUncontended(name string, rate float64) *uncontendedResult {
	forever := time.Now().Add(24 * time.Hour)
	return &uncontendedResult{System: name, Rate: rate, acq: newRecorder(time.Time{}, forever), rel: newRecorder(time.Time{}, forever)}
}

// loop runs the open loop from now until we; acquisitions scheduled from ws
// on are recorded, and their releases and completed pairs.
func (u *uncontendedResult) loop(ctx context.Context, sys locker, free pool, ws, we time.Time, maxInFlight int) {
	var mu sync.Mutex
	openLoop(ctx, u.Rate, time.Now(), we, maxInFlight, func(sched time.Time) {
		measured := !sched.Before(ws)
		idx, ok := free.take()
		if !ok {
			if measured {
				u.acq.record(sched, errors.New("no free lock object left"))
			}
			return
		}
		defer func() { free <- idx }()
		h, err := sys.acquire(inPhase(ctx, "acquire"), lockName(idx))
		if measured {
			u.acq.record(sched, err)
		}
		if err != nil {
			return
		}
		u.tr.done("acquire")
		rs := time.Now()
		err = h.release(inPhase(ctx, "release"))
		if err == nil {
			u.tr.done("release")
		}
		if measured {
			u.rel.record(rs, err)
		}
		if err == nil && measured {
			mu.Lock()
			u.pairs++
			mu.Unlock()
		}
	}, func(sched time.Time) {
		if !sched.Before(ws) {
			u.acq.record(sched, errors.New("client-side in-flight limit reached"))
		}
	})
}

func (u *uncontendedResult) result(measured time.Duration) *uncontendedResult {
	a, ae, ak := u.acq.snapshot()
	r, re, rk := u.rel.snapshot()
	for k, v := range rk {
		ak[k] += v
	}
	u.Acquire, u.Release = summarize(a), summarize(r)
	u.Pairs = float64(u.pairs) / measured.Seconds()
	u.Errors, u.ErrKinds = ae+re, ak
	if u.tr != nil {
		u.Trips = u.tr.summary()
	}
	return u
}

// --- workload 3: contended hand-off --------------------------------------------------

// mutexFn acquires (blocking, in the system's own way of waiting) and returns
// the function that releases.
type mutexFn func(ctx context.Context) (unlock func() error, err error)

type handoffResult struct {
	System         string
	Clients        int
	Holdings       int
	PerSecond      float64
	Handoff        dist
	Lat            []time.Duration
	FIFOViolations int
	FIFOChecked    int
	// ServerFIFO: kubelock only, from a watch of the lock object.
	ServerFIFOViolations, ServerFIFOChecked int
	ServerFIFO                              bool
	Errors                                  int
	ErrKinds                                map[string]int
	Trips                                   []tripLine // kubelock only: requests per acquire and release
}

type holdEvent struct {
	client   int
	called   time.Time // the acquire call started
	acquired time.Time
	released time.Time
}

// fifoSlack is how much later than a waiting call another call may have
// started and still be served first without counting as overtaking: the
// time it takes to join a queue (a read and a write).
const fifoSlack = 250 * time.Millisecond

// runHandoff runs K clients that each take the one lock, hold it for hold,
// release it and queue again, for warmup+measure.
func runHandoff(ctx context.Context, name string, k int, hold, warmup, measure time.Duration, newMutex func(i int) (mutexFn, error)) *handoffResult {
	res := &handoffResult{System: name, Clients: k, ErrKinds: map[string]int{}}
	fns := make([]mutexFn, k)
	for i := range k {
		f, err := newMutex(i)
		if err != nil {
			res.Errors++
			res.ErrKinds[errKind(err)]++
			return res
		}
		fns[i] = f
	}
	start := time.Now()
	ws, we := start.Add(warmup), start.Add(warmup+measure)
	runCtx, cancel := context.WithDeadline(ctx, we)
	defer cancel()
	var mu sync.Mutex
	var events []holdEvent
	var holdings atomic.Int64
	errs := newRecorder(ws, we)
	var wg sync.WaitGroup
	for i := range k {
		wg.Go(func() {
			for runCtx.Err() == nil {
				t := time.Now()
				unlock, err := fns[i](runCtx)
				if err != nil {
					if runCtx.Err() == nil {
						errs.record(t, err)
						time.Sleep(50 * time.Millisecond)
					}
					continue
				}
				ev := holdEvent{client: i, called: t, acquired: time.Now()}
				mine := holdings.Add(1)
				time.Sleep(hold)
				ev.released = time.Now()
				mu.Lock()
				events = append(events, ev)
				mu.Unlock()
				if err := unlock(); err != nil {
					errs.record(ev.released, err)
				}
				// Compete again only once another client holds the lock, so
				// every holding is a hand-off (a releaser that re-entered at
				// once could win its own lock back where nothing queues).
				for holdings.Load() == mine && runCtx.Err() == nil {
					time.Sleep(time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	// Holdings in acquisition order; the hand-off is from one release's start
	// to the next holder's acquire returning.
	sortEvents(events)
	var lat []time.Duration
	for i, ev := range events {
		if ev.acquired.Before(ws) {
			continue
		}
		res.Holdings++
		if i > 0 {
			lat = append(lat, ev.acquired.Sub(events[i-1].released))
		}
		// FIFO: a holding overtakes when a call that was still waiting (it
		// was served later) had started more than fifoSlack before this one.
		res.FIFOChecked++
		for _, later := range events[i+1:] {
			if later.called.Before(ev.acquired) && later.called.Add(fifoSlack).Before(ev.called) {
				res.FIFOViolations++
				break
			}
		}
	}
	res.Lat = lat
	res.Handoff = summarize(lat)
	res.PerSecond = float64(res.Holdings) / measure.Seconds()
	_, e, kinds := errs.snapshot()
	res.Errors += e
	for kk, v := range kinds {
		res.ErrKinds[kk] += v
	}
	return res
}

func sortEvents(ev []holdEvent) {
	for i := 1; i < len(ev); i++ {
		for j := i; j > 0 && ev[j].acquired.Before(ev[j-1].acquired); j-- {
			ev[j], ev[j-1] = ev[j-1], ev[j]
		}
	}
}

// kubelockMutex: tr counts the requests of acquire and release.
func kubelockMutex(newClient lockClientFactory, cfg *rest.Config, key string, tr *trips) func(i int) (mutexFn, error) {
	return func(i int) (mutexFn, error) {
		c, err := newClient(tr.wrap(cfg), lock.WithNamespace(workNS), lock.WithIdentity(fmt.Sprintf("contender-%d", i)))
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context) (func() error, error) {
			l, err := c.Acquire(inPhase(ctx, "acquire"), key)
			if err != nil {
				return nil, err
			}
			tr.done("acquire")
			return func() error {
				err := l.Release(inPhase(context.Background(), "release"))
				if err == nil {
					tr.done("release")
				}
				return err
			}, nil
		}, nil
	}
}

func etcdMutex(cli *clientv3.Client, key string, cleanup *[]func()) func(i int) (mutexFn, error) {
	return func(int) (mutexFn, error) {
		s, err := concurrency.NewSession(cli, concurrency.WithTTL(30))
		if err != nil {
			return nil, err
		}
		*cleanup = append(*cleanup, func() { _ = s.Close() })
		return func(ctx context.Context) (func() error, error) {
			m := concurrency.NewMutex(s, key)
			if err := m.Lock(ctx); err != nil {
				return nil, err
			}
			return func() error { return m.Unlock(context.Background()) }, nil
		}, nil
	}
}

// redisMutex: redsync's defaults (8 s expiry, retry after 50–250 ms) except
// tries, raised so that a waiter does not give up after 32 tries.
func redisMutex(rs *redsync.Redsync, key string) func(i int) (mutexFn, error) {
	return func(int) (mutexFn, error) {
		return func(ctx context.Context) (func() error, error) {
			m := rs.NewMutex(key, redsync.WithTries(1<<20))
			if err := m.LockContext(ctx); err != nil {
				return nil, err
			}
			return func() error {
				_, err := m.UnlockContext(context.Background())
				return err
			}, nil
		}, nil
	}
}

// leaderElectionMutex is client-go's leader election with its default timings
// on a Lease: leading is holding; cancelling releases (ReleaseOnCancel).
func leaderElectionMutex(cs kubernetes.Interface, name string) func(i int) (mutexFn, error) {
	return func(i int) (mutexFn, error) {
		id := fmt.Sprintf("contender-%d", i)
		return func(ctx context.Context) (func() error, error) {
			return leadUntilStopped(ctx, func(onLead func(context.Context)) (*leaderelection.LeaderElector, error) {
				return newElector(cs, name, id, true, onLead)
			})
		}, nil
	}
}

// leadUntilStopped runs the elector newElector builds (calling onLead when it
// leads) until it leads; stop cancels it, which releases with ReleaseOnCancel.
func leadUntilStopped(ctx context.Context, newElector func(onLead func(context.Context)) (*leaderelection.LeaderElector, error)) (stop func() error, err error) {
	led := make(chan struct{})
	le, err := newElector(func(context.Context) { close(led) })
	if err != nil {
		return nil, err
	}
	leCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); le.Run(leCtx) }()
	select {
	case <-led:
		return func() error { cancel(); <-done; return nil }, nil
	case <-done:
		cancel()
		return nil, ctx.Err()
	case <-ctx.Done():
		cancel()
		<-done
		return nil, ctx.Err()
	}
}

func newElector(cs kubernetes.Interface, name, id string, releaseOnCancel bool, onLead func(context.Context)) (*leaderelection.LeaderElector, error) {
	return leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: workNS, Name: name},
			Client:     cs.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: id},
		},
		LeaseDuration:   leLeaseDuration,
		RenewDeadline:   leRenewDeadline,
		RetryPeriod:     leRetryPeriod,
		ReleaseOnCancel: releaseOnCancel,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: onLead,
			OnStoppedLeading: func() {},
		},
	})
}

// --- workload 4: expiry ------------------------------------------------------------

type expiryResult struct {
	System   string
	Trials   int
	Lat      []time.Duration
	Expiry   dist
	Errors   int
	ErrKinds map[string]int
	Lease    time.Duration
}

// runExpiry runs trials in parallel: a holder that dies without releasing and
// a waiter; the latency is from the end of the dead holder's lease to the
// waiter's acquire returning.
func runExpiry(ctx context.Context, name string, trials int, lease time.Duration, trial func(ctx context.Context, j int) (time.Duration, error)) *expiryResult {
	res := &expiryResult{System: name, Trials: trials, ErrKinds: map[string]int{}, Lease: lease}
	rec := newRecorder(time.Time{}, time.Now().Add(24*time.Hour))
	var wg sync.WaitGroup
	for j := range trials {
		wg.Go(func() {
			tctx, cancel := context.WithTimeout(ctx, lease+90*time.Second)
			defer cancel()
			d, err := trial(tctx, j)
			rec.add(d, err)
		})
	}
	wg.Wait()
	lat, errs, kinds := rec.snapshot()
	res.Lat, res.Expiry, res.Errors, res.ErrKinds = lat, summarize(lat), errs, kinds
	return res
}

// kubelockExpiryTrial: the holder acquires with a short lease and never renews
// or releases (as if killed); the waiter queues; the controller expires the
// holding once it has not observed a renewal for the lease plus its grace.
func kubelockExpiryTrial(c *cluster, prefix string, lease time.Duration) func(ctx context.Context, j int) (time.Duration, error) {
	return func(ctx context.Context, j int) (time.Duration, error) {
		key := fmt.Sprintf("%s-%d", prefix, j)
		if err := c.env.Client.Create(ctx, &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: workNS, Name: key}}); err != nil {
			return 0, err
		}
		a, err := lock.New(c.user, lock.WithNamespace(workNS), lock.WithIdentity("doomed"), lock.WithoutAutoRenew())
		if err != nil {
			return 0, err
		}
		b, err := lock.New(c.user, lock.WithNamespace(workNS), lock.WithIdentity("next"))
		if err != nil {
			return 0, err
		}
		la, err := a.TryAcquire(ctx, key, lock.WithLeaseDuration(lease))
		if err != nil {
			return 0, err
		}
		// ExpiresAt is the send time of the acquiring write plus the lease
		// minus the client's safety margin.
		leaseEnd := la.ExpiresAt().Add(lock.SafetyMargin(lease))
		lb, err := b.Acquire(ctx, key)
		if err != nil {
			return 0, err
		}
		got := time.Now()
		_ = lb.Release(context.Background())
		return got.Sub(leaseEnd), nil
	}
}

// leaderElectionExpiryTrial: the leader stops renewing without releasing;
// the lease ends at its last renewTime plus leaseDurationSeconds.
func leaderElectionExpiryTrial(cs kubernetes.Interface, prefix string) func(ctx context.Context, j int) (time.Duration, error) {
	return func(ctx context.Context, j int) (time.Duration, error) {
		name := fmt.Sprintf("%s-%d", prefix, j)
		return electorExpiryTrial(ctx,
			func(onLead func(context.Context)) (*leaderelection.LeaderElector, error) {
				return newElector(cs, name, "doomed", false, onLead)
			},
			func(onLead func(context.Context)) (*leaderelection.LeaderElector, error) {
				return newElector(cs, name, "next", true, onLead)
			},
			func(ctx context.Context) (time.Time, error) {
				l, err := cs.CoordinationV1().Leases(workNS).Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					return time.Time{}, err
				}
				if l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
					return time.Time{}, errors.New("lease without renewTime")
				}
				return l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second), nil
			})
	}
}

// electorExpiryTrial: the elector newDoomed builds leads, then stops without
// releasing (as if killed) while the one newNext builds waits; the latency is
// from the doomed leader's lease end (leaseEnd, asked once it stopped) to the
// next one leading.
func electorExpiryTrial(ctx context.Context, newDoomed, newNext func(onLead func(context.Context)) (*leaderelection.LeaderElector, error),
	leaseEnd func(context.Context) (time.Time, error)) (time.Duration, error) {
	led := make(chan struct{})
	aCtx, killA := context.WithCancel(ctx)
	defer killA()
	a, err := newDoomed(func(context.Context) { close(led) })
	if err != nil {
		return 0, err
	}
	aDone := make(chan struct{})
	go func() { defer close(aDone); a.Run(aCtx) }()
	select {
	case <-led:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	bLed := make(chan time.Time, 1)
	bCtx, stopB := context.WithCancel(ctx)
	defer stopB()
	b, err := newNext(func(context.Context) { bLed <- time.Now() })
	if err != nil {
		return 0, err
	}
	go b.Run(bCtx)
	time.Sleep(time.Second)
	killA()
	<-aDone
	end, err := leaseEnd(ctx)
	if err != nil {
		return 0, err
	}
	select {
	case got := <-bLed:
		return got.Sub(end), nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// etcdExpiryTrial: the holder's session stops its keep-alive (Orphan) without
// revoking; the lease ends TTL after its last keep-alive, which the trial
// sends itself so that the time is known.
func etcdExpiryTrial(cli *clientv3.Client, prefix string, ttl int) func(ctx context.Context, j int) (time.Duration, error) {
	return func(ctx context.Context, j int) (time.Duration, error) {
		key := fmt.Sprintf("%s-%d", prefix, j)
		sa, err := concurrency.NewSession(cli, concurrency.WithTTL(ttl))
		if err != nil {
			return 0, err
		}
		sb, err := concurrency.NewSession(cli, concurrency.WithTTL(ttl))
		if err != nil {
			return 0, err
		}
		defer func() { _ = sb.Close() }()
		ma, mb := concurrency.NewMutex(sa, key), concurrency.NewMutex(sb, key)
		if err := ma.Lock(ctx); err != nil {
			return 0, err
		}
		bGot := make(chan time.Time, 1)
		bErr := make(chan error, 1)
		go func() {
			if err := mb.Lock(ctx); err != nil {
				bErr <- err
				return
			}
			bGot <- time.Now()
		}()
		time.Sleep(300 * time.Millisecond)
		sa.Orphan()
		sent := time.Now()
		ka, err := cli.KeepAliveOnce(ctx, sa.Lease())
		if err != nil {
			return 0, err
		}
		leaseEnd := sent.Add(time.Duration(ka.TTL) * time.Second)
		select {
		case got := <-bGot:
			_ = mb.Unlock(context.Background())
			return got.Sub(leaseEnd), nil
		case err := <-bErr:
			return 0, err
		}
	}
}

// serverFIFO watches a kubelock lock during the hand-off run and checks the
// queue discipline on the server's own record: every new holder was the head
// of the queue in the version before (or the queue was empty).
type serverFIFO struct {
	mu         sync.Mutex
	prev       *locksv1alpha1.DistributedLock
	checked    int
	violations int
	stop       func()
	done       chan struct{}
}

func watchFIFO(ctx context.Context, c *cluster, key string) (*serverFIFO, error) {
	f := &serverFIFO{done: make(chan struct{})}
	wc, err := client.NewWithWatch(c.admin, client.Options{Scheme: c.env.Scheme})
	if err != nil {
		return nil, err
	}
	w, err := wc.Watch(ctx, &locksv1alpha1.DistributedLockList{}, client.InNamespace(workNS), client.MatchingFields{"metadata.name": key})
	if err != nil {
		return nil, err
	}
	f.stop = w.Stop
	go func() {
		defer close(f.done)
		for ev := range w.ResultChan() {
			l, ok := ev.Object.(*locksv1alpha1.DistributedLock)
			if !ok {
				continue
			}
			f.observe(l)
		}
	}()
	return f, nil
}

func (f *serverFIFO) observe(l *locksv1alpha1.DistributedLock) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.prev
	f.prev = l
	if p == nil || l.Status.Holder == nil {
		return
	}
	if p.Status.Holder != nil && p.Status.Holder.LeaseID == l.Status.Holder.LeaseID {
		return
	}
	f.checked++
	if len(p.Status.Waiters) > 0 && p.Status.Waiters[0].RequestID != l.Status.Holder.RequestID {
		f.violations++
	}
}

func (f *serverFIFO) result() (violations, checked int) {
	f.stop()
	<-f.done
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.violations, f.checked
}

// kubelockElectionMutex is client-go's leader election with its default
// timings on a DistributedLock (pkg/lock/leaderelection): leading is holding;
// cancelling releases (ReleaseOnCancel). One ResourceLock serves one term, so
// every attempt builds a new one, as leaderElectionMutex builds a new elector.
func kubelockElectionMutex(c *cluster, key string) func(i int) (mutexFn, error) {
	return func(i int) (mutexFn, error) {
		id := fmt.Sprintf("contender-%d", i)
		return func(ctx context.Context) (func() error, error) {
			created := c.env.Client.Create(ctx, &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: workNS, Name: key}})
			if created != nil && !apierrors.IsAlreadyExists(created) {
				return nil, created
			}
			return runKubelockElector(ctx, c.user, key, id)
		}, nil
	}
}

// runKubelockElector runs an elector with client-go's default timings on the
// DistributedLock key until it leads; stop cancels it (and so releases).
func runKubelockElector(ctx context.Context, cfg *rest.Config, key, id string) (stop func() error, err error) {
	rl, err := kle.New(cfg, key, kle.Options{LeaseDuration: leLeaseDuration, RenewDeadline: leRenewDeadline, RetryPeriod: leRetryPeriod},
		lock.WithNamespace(workNS), lock.WithIdentity(id))
	if err != nil {
		return nil, err
	}
	return leadUntilStopped(ctx, func(onLead func(context.Context)) (*leaderelection.LeaderElector, error) {
		return leaderelection.NewLeaderElector(rl.ElectionConfig(leaderelection.LeaderCallbacks{OnStartedLeading: onLead, OnStoppedLeading: func() {}}))
	})
}

// kubelockElectionExpiryTrial: the leader's elector stops without releasing
// (as if killed); its holding is not renewed and lapses; the controller
// expires it and the waiting candidate leads. Lease end: the holding's
// ExpiresAt plus the client's safety margin (the last renewal's send + lease).
func kubelockElectionExpiryTrial(c *cluster, prefix string) func(ctx context.Context, j int) (time.Duration, error) {
	return func(ctx context.Context, j int) (time.Duration, error) {
		key := fmt.Sprintf("%s-%d", prefix, j)
		if err := c.env.Client.Create(ctx, &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: workNS, Name: key}}); err != nil {
			return 0, err
		}
		elector := func(id string, releaseOnCancel bool) (*kle.ResourceLock, func(func(context.Context)) (*leaderelection.LeaderElector, error), error) {
			rl, err := kle.New(c.user, key, kle.Options{LeaseDuration: leLeaseDuration, RenewDeadline: leRenewDeadline, RetryPeriod: leRetryPeriod},
				lock.WithNamespace(workNS), lock.WithIdentity(id))
			return rl, func(onLead func(context.Context)) (*leaderelection.LeaderElector, error) {
				cfg := rl.ElectionConfig(leaderelection.LeaderCallbacks{OnStartedLeading: onLead, OnStoppedLeading: func() {}})
				cfg.ReleaseOnCancel = releaseOnCancel
				return leaderelection.NewLeaderElector(cfg)
			}, err
		}
		doomed, newDoomed, err := elector("doomed", false) // killed: it never releases
		if err != nil {
			return 0, err
		}
		_, newNext, err := elector("next", true)
		if err != nil {
			return 0, err
		}
		return electorExpiryTrial(ctx, newDoomed, newNext, func(context.Context) (time.Time, error) {
			h := doomed.Holding()
			if h == nil {
				return time.Time{}, errors.New("the doomed leader has no holding")
			}
			return h.ExpiresAt().Add(lock.SafetyMargin(leLeaseDuration)), nil
		})
	}
}
