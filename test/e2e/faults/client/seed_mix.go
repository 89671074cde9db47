//go:build faults

package main

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kubelock/kubelock/test/e2e/faults/wire"

	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/history"
)

// The seed mix, as test/bench runs it: lock writes one third each
// acquisitions, renewals and releases. A held population of rate/3 ×
// renewal-interval locks is renewed every interval (lease/3) from a random
// phase, and a churn takes a free lock rate/3 times a second, holds it for
// Hold and releases it. Every acquisition is a TryAcquire of a lock nobody
// else holds: this process's keys are its own. The process renews by hand
// (a client WithoutAutoRenew), so that renewals keep their schedule and each
// is timed. Every operation is recorded in the history as the other commands
// record theirs.

// seedMaxInFlight bounds the churn's operations in flight; one beyond it
// fails, so that a stalled control plane shows as errors, not as a schedule
// the churn quietly stopped keeping.
const seedMaxInFlight = 1000

// seedRetire is how long a key whose last operation failed stays out of the
// pool: a lease plus more than the controller's expiry grace, after which any
// holding the operation may have left has been expired.
func seedRetire(lease time.Duration) time.Duration { return lease + 10*time.Second }

type seedMix struct {
	p     *proc
	lc    *lock.Client
	lease time.Duration
	free  chan string
	stop  chan struct{}
	wg    sync.WaitGroup

	mu      sync.Mutex
	samples []wire.Sample
	held    []*lock.Lock
	lost    int
}

// newSeedMix prepares a seed mix on keys with its own client, which never
// renews by itself.
func (p *proc) newSeedMix(c wire.Command) (*seedMix, error) {
	lc, err := lock.New(p.cfg, lock.WithNamespace(p.lc.Namespace()), lock.WithIdentity(p.name), lock.WithoutAutoRenew(), lock.WithLeaseDuration(c.Lease))
	if err != nil {
		return nil, err
	}
	m := &seedMix{p: p, lc: lc, lease: c.Lease, free: make(chan string, len(c.Keys)), stop: make(chan struct{})}
	for _, i := range rand.Perm(len(c.Keys)) {
		m.free <- c.Keys[i]
	}
	return m, nil
}

// seedCapacity runs the closed-loop capacity step: N workers each take a
// free lock, renew it once and release it, as fast as they can, for Warmup
// and then For; it answers the lock writes completed in For, and the failed.
func (p *proc) seedCapacity(c wire.Command) wire.Reply {
	m, err := p.newSeedMix(c)
	if err != nil {
		return wire.Reply{ID: c.ID, Outcome: history.Failed, Err: err.Error()}
	}
	from := time.Now().Add(c.Warmup)
	to := from.Add(c.For)
	var ok, failed atomic.Int64
	count := func(err error) {
		if now := time.Now(); now.Before(from) || now.After(to) {
			return
		}
		if err != nil {
			failed.Add(1)
			return
		}
		ok.Add(1)
	}
	var wg sync.WaitGroup
	for range max(c.N, 1) {
		wg.Go(func() {
			for time.Now().Before(to) {
				var key string
				select {
				case key = <-m.free:
				case <-time.After(time.Until(to)):
					return
				}
				l, err := m.acquire(key)
				count(err)
				if err != nil {
					m.retire(key)
					continue
				}
				count(m.p.renew(l))
				err = m.p.releaseLock(l)
				count(err)
				m.giveBack(key, err)
			}
		})
	}
	wg.Wait()
	return wire.Reply{ID: c.ID, Outcome: history.OK, Ops: ok.Load(), Errors: int(failed.Load())}
}

// startSeed holds the population, then starts its renewals and the churn;
// it answers once the population is held.
func (p *proc) startSeed(c wire.Command) wire.Reply {
	m, err := p.newSeedMix(c)
	if err != nil {
		return wire.Reply{ID: c.ID, Outcome: history.Failed, Err: err.Error()}
	}
	perSecond := c.Rate / 3
	renewEvery := c.Lease / 3
	if err := m.hold(int(perSecond * renewEvery.Seconds())); err != nil {
		m.halt()
		return wire.Reply{ID: c.ID, Outcome: history.Failed, Err: err.Error()}
	}
	for _, l := range m.held {
		m.wg.Go(func() { m.keep(l, renewEvery) })
	}
	m.wg.Go(func() { m.churn(perSecond, c.Hold) })
	p.mu.Lock()
	p.seed = m
	p.mu.Unlock()
	return wire.Reply{ID: c.ID, Outcome: history.OK}
}

// stopSeed stops the seed mix, releases what it holds and answers its
// samples and the holdings it lost.
func (p *proc) stopSeed(c wire.Command) wire.Reply {
	p.mu.Lock()
	m := p.seed
	p.seed = nil
	p.mu.Unlock()
	if m == nil {
		return wire.Reply{ID: c.ID, Outcome: history.Failed, Err: "no seed mix under way"}
	}
	m.halt()
	m.mu.Lock()
	defer m.mu.Unlock()
	return wire.Reply{ID: c.ID, Outcome: history.OK, Samples: m.samples, Lost: m.lost}
}

// halt stops the renewals and the churn and releases the population.
func (m *seedMix) halt() {
	close(m.stop)
	m.wg.Wait()
	var wg sync.WaitGroup
	for _, l := range m.held {
		if l.Err() == nil {
			wg.Go(func() { _ = m.p.releaseLock(l) })
		}
	}
	wg.Wait()
}

// hold acquires n free locks, a few at a time, for the renewed population.
func (m *seedMix) hold(n int) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	next := make(chan struct{}, n)
	for range n {
		next <- struct{}{}
	}
	close(next)
	for range 4 {
		wg.Go(func() {
			for range next {
				key, ok := m.take()
				if !ok {
					mu.Lock()
					first = cmpErr(first, errNoFreeLock)
					mu.Unlock()
					return
				}
				l, err := m.acquire(key)
				mu.Lock()
				if err != nil {
					m.retire(key)
					first = cmpErr(first, err)
				} else {
					m.held = append(m.held, l)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return first
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

var errNoFreeLock = errors.New("no free lock left: the pool is too small for the rate")

// take is a free key, if one is left.
func (m *seedMix) take() (string, bool) {
	select {
	case k := <-m.free:
		return k, true
	default:
		return "", false
	}
}

// giveBack returns key to the pool: at once after a release that
// succeeded, else once any holding it may have left has expired.
func (m *seedMix) giveBack(key string, err error) {
	if err == nil {
		m.free <- key
		return
	}
	m.retire(key)
}

func (m *seedMix) retire(key string) {
	time.AfterFunc(seedRetire(m.lease), func() { m.free <- key })
}

// acquire takes key, which nobody holds, and records the loss of the holding
// should it end before it is released.
func (m *seedMix) acquire(key string) (*lock.Lock, error) {
	l, r := m.p.take(context.Background(), m.lc, wire.Command{Key: key, Try: true, Wait: 20 * time.Second, Lease: m.lease})
	if l == nil {
		return nil, errors.New(r.Outcome + ": " + r.Err)
	}
	go func() {
		<-l.Done()
		m.p.ended(l)
	}()
	return l, nil
}

// renew renews l by hand and records its new safe deadline.
func (p *proc) renew(l *lock.Lock) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := l.Renew(ctx); err != nil {
		return err
	}
	p.rec.Record(history.Event{Op: history.OpDeadline, Phase: history.Point, Key: l.Key(), Lease: l.LeaseID(), Deadline: history.MonoAt(l.ExpiresAt())})
	return nil
}

// sample notes op, scheduled at sched, ending now with err.
func (m *seedMix) sample(op string, sched time.Time, err error) {
	s := wire.Sample{Op: op, T: history.MonoAt(sched), Lat: int64(time.Since(sched))}
	if err != nil {
		s.Err = err.Error()
	}
	m.mu.Lock()
	m.samples = append(m.samples, s)
	m.mu.Unlock()
}

// keep renews l every interval from a random phase, each renewal timed from
// its scheduled time, until the mix stops or the holding is lost.
func (m *seedMix) keep(l *lock.Lock, every time.Duration) {
	next := time.Now().Add(rand.N(every))
	for {
		t := time.NewTimer(time.Until(next))
		select {
		case <-m.stop:
			t.Stop()
			return
		case <-t.C:
		}
		m.sample("renew", next, m.p.renew(l))
		if l.Err() != nil {
			m.mu.Lock()
			m.lost++
			m.mu.Unlock()
			return
		}
		next = next.Add(every)
	}
}

// churn takes a free lock perSecond times a second on an open-loop
// schedule (a slow control plane makes latencies grow, not the schedule
// slip), each held for hold and released.
func (m *seedMix) churn(perSecond float64, hold time.Duration) {
	if perSecond <= 0 {
		return
	}
	interval := time.Duration(float64(time.Second) / perSecond)
	var inflight atomic.Int64
	var wg sync.WaitGroup
	defer wg.Wait()
	start := time.Now()
	for i := 0; ; i++ {
		sched := start.Add(time.Duration(i) * interval)
		t := time.NewTimer(time.Until(sched))
		select {
		case <-m.stop:
			t.Stop()
			return
		case <-t.C:
		}
		if inflight.Load() >= seedMaxInFlight {
			m.sample("acquire", sched, errors.New("client-side in-flight limit reached"))
			continue
		}
		inflight.Add(1)
		wg.Go(func() {
			defer inflight.Add(-1)
			m.churnOne(sched, hold)
		})
	}
}

// churnOne is one acquisition of the churn: acquire, hold, release.
func (m *seedMix) churnOne(sched time.Time, hold time.Duration) {
	key, ok := m.take()
	if !ok {
		m.sample("acquire", sched, errNoFreeLock)
		return
	}
	l, err := m.acquire(key)
	m.sample("acquire", sched, err)
	if err != nil {
		m.retire(key)
		return
	}
	time.Sleep(hold) // the workload's holding time, not synchronisation
	released := time.Now()
	err = m.p.releaseLock(l)
	m.sample("release", released, err)
	m.giveBack(key, err)
}
