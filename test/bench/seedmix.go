package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// lockName is the i-th seed-mix object (a DistributedLock or a Lease).
func lockName(i int) string { return fmt.Sprintf("l-%06d", i) }

// createObjects creates n objects with workers in parallel and returns how long it took.
func createObjects(ctx context.Context, n, workers int, create func(ctx context.Context, i int) error) (time.Duration, error) {
	start := time.Now()
	var next atomic.Int64
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				for attempt := 0; ; attempt++ {
					err := create(ctx, i)
					if err == nil {
						break
					}
					if attempt >= 5 {
						once.Do(func() { first = fmt.Errorf("creating object %d: %w", i, err) })
						return
					}
					time.Sleep(time.Duration(attempt+1) * 100 * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start), first
}

func createLocks(ctx context.Context, c client.Client, n int) (time.Duration, error) {
	return createObjects(ctx, n, 48, func(ctx context.Context, i int) error {
		err := c.Create(ctx, &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: lockNS, Name: lockName(i)}})
		return ignoreExists(err)
	})
}

func createLeases(ctx context.Context, cs kubernetes.Interface, n int) (time.Duration, error) {
	return createObjects(ctx, n, 48, func(ctx context.Context, i int) error {
		_, err := cs.CoordinationV1().Leases(leaseNS).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: lockName(i)}}, metav1.CreateOptions{})
		return ignoreExists(err)
	})
}

func ignoreExists(err error) error {
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// pool hands out free object indices.
type pool chan int

func newPool(n int) pool {
	p := make(pool, n)
	for _, i := range rand.Perm(n) {
		p <- i
	}
	return p
}

func (p pool) take() (int, bool) {
	select {
	case i := <-p:
		return i, true
	default:
		return 0, false
	}
}

// mixConfig shapes the seed mix: the seed's reference workload holds 20,000
// locks renewed every 10 s of a 30 s lease (2,000 renewals/s) and takes and
// gives back 2,000 locks/s: one third each of acquisitions, renewals and
// releases. A step offering R lock writes/s holds R/3 × lease/3 locks.
type mixConfig struct {
	lease       time.Duration
	churnHold   time.Duration
	warmup      time.Duration
	measure     time.Duration
	rates       []float64 // the coarse steps, before bisection
	absTol      float64   // bisection stops at a bracket this many writes/s wide...
	relTol      float64   // ...or within ±relTol of its middle
	maxSteps    int       // steps per system, coarse and bisection together
	objects     int       // lock objects the pool holds
	p99Limit    time.Duration
	maxInFlight int
	profileStep int    // index of the step to profile; -1 none
	profileDir  string // where CPU profiles go
}

// stepResult is one rate step of the seed mix.
type stepResult struct {
	Offered  float64 // lock writes/s offered
	Held     int
	Achieved float64 // lock writes/s completed without error in the window
	All      dist
	Acquire  dist
	Renew    dist
	Release  dist
	Errors   int
	ErrKinds map[string]int
	// Apiserver writes/s (all resources) in the window, and by verb and resource.
	APIWrites float64
	APIByKind writeCounts
	// APICPU is kube-apiserver's CPU seconds per second in the window, CPU
	// every watched process's.
	APICPU    float64
	CPU       usage
	Sustained bool
	Profiles  []string
}

// apiCPUPerWrite is kube-apiserver's CPU milliseconds per lock write.
func (sr stepResult) apiCPUPerWrite() float64 {
	if sr.Achieved <= 0 {
		return 0
	}
	return 1000 * sr.APICPU / sr.Achieved
}

type mixResult struct {
	System string
	// Steps in the order they ran: the coarse steps up to the first one not
	// sustained, then the bisection.
	Steps   []stepResult
	Bracket bracket
	CPU     usage
	Wall    time.Duration
}

// best is the highest sustained step, or the lowest step run when none was.
func (m *mixResult) best() (stepResult, bool) {
	if m == nil || len(m.Steps) == 0 {
		return stepResult{}, false
	}
	lowest := m.Steps[0]
	for _, s := range m.Steps {
		if s.Sustained && s.Offered == m.Bracket.Sustained {
			return s, true
		}
		if s.Offered < lowest.Offered {
			lowest = s
		}
	}
	return lowest, false
}

// heldLock is a lock of the held population with its renewal goroutine.
type heldLock struct {
	idx  int
	h    holding
	stop chan struct{}
	done chan struct{}
	// failed: a renewal failed and the holding stopped renewing (prune).
	failed atomic.Bool
}

// heldPopulation is the seed mix's held locks, each renewed every lease/3 on
// its own schedule; the population grows and shrinks with the offered rate.
type heldPopulation struct {
	sys        locker
	free       pool
	renewEvery time.Duration
	cur        *atomic.Pointer[[3]*recorder] // renewals are recorded in [1]
	locks      []*heldLock
}

// resize acquires or releases locks until n are held.
func (p *heldPopulation) resize(ctx context.Context, n int) error {
	p.prune()
	if n < len(p.locks) {
		drop := p.locks[n:]
		p.locks = p.locks[:n]
		parallel(drop, func(hl *heldLock) {
			close(hl.stop)
			<-hl.done
			p.giveBack(hl.idx, hl.h.release(ctx))
		})
		return nil
	}
	need := n - len(p.locks)
	var mu sync.Mutex
	var failed atomic.Int64
	var first atomic.Pointer[error]
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for next.Add(1) <= int64(need) {
				idx, ok := p.free.take()
				if !ok {
					failed.Add(1)
					return
				}
				h, err := p.sys.acquire(ctx, lockName(idx))
				if err != nil {
					p.giveBack(idx, err)
					failed.Add(1)
					first.CompareAndSwap(nil, &err)
					continue
				}
				hl := &heldLock{idx: idx, h: h, stop: make(chan struct{}), done: make(chan struct{})}
				go p.renew(ctx, hl)
				mu.Lock()
				p.locks = append(p.locks, hl)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if f := failed.Load(); f > 0 {
		err := errors.New("none left in the pool")
		if e := first.Load(); e != nil {
			err = *e
		}
		return fmt.Errorf("%d of %d acquisitions for the held population failed, the first: %w", f, need, err)
	}
	return nil
}

// giveBack returns lock idx to the pool after a release or a failed
// acquisition, unless the request failed: then the lock may still be held
// (a release that did not commit, an acquisition that did though its answer
// was lost), and where no controller expires it, it would be held for good.
func (p *heldPopulation) giveBack(idx int, err error) {
	if err == nil {
		p.free <- idx
	}
}

// renew renews hl every renewEvery from a random phase until it is stopped,
// recording each renewal against its scheduled time.
func (p *heldPopulation) renew(ctx context.Context, hl *heldLock) {
	defer close(hl.done)
	next := time.Now().Add(time.Duration(rand.Int64N(int64(p.renewEvery))))
	for {
		t := time.NewTimer(time.Until(next))
		select {
		case <-hl.stop:
			t.Stop()
			return
		case <-t.C:
		}
		done := func(error) {}
		if r := p.cur.Load(); r != nil {
			done = r[1].begin(next)
		}
		err := hl.h.renew(ctx)
		done(err)
		if err != nil {
			hl.failed.Store(true)
			return
		}
		next = next.Add(p.renewEvery)
	}
}

// prune drops the holdings whose renewal failed, so that one overloaded
// step does not fail every step after it with renewals of holdings already
// lost; resize acquires others in their place. Their locks do not go back
// to the pool (see giveBack).
func (p *heldPopulation) prune() {
	kept := p.locks[:0]
	for _, hl := range p.locks {
		if !hl.failed.Load() {
			kept = append(kept, hl)
		}
	}
	p.locks = kept
}

// parallel calls f for each item with 32 workers.
func parallel[T any](items []T, f func(T)) {
	ch := make(chan T)
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for it := range ch {
				f(it)
			}
		})
	}
	for _, it := range items {
		ch <- it
	}
	close(ch)
	wg.Wait()
}

// mixRunner runs seed-mix windows against one system: its held population
// and the recorders of the window under way.
type mixRunner struct {
	c    *cluster
	sys  locker
	name string
	free pool
	cfg  mixConfig
	pw   *procWatch
	cur  atomic.Pointer[[3]*recorder] // acquire, renew, release of the current window
	held *heldPopulation
}

func newMixRunner(c *cluster, sys locker, name string, free pool, cfg mixConfig, pw *procWatch) *mixRunner {
	m := &mixRunner{c: c, sys: sys, name: name, free: free, cfg: cfg, pw: pw}
	m.held = &heldPopulation{sys: sys, free: free, renewEvery: cfg.lease / 3, cur: &m.cur}
	return m
}

// errTooFewObjects: a step needs more lock objects than the pool has.
var errTooFewObjects = errors.New("raise --locks")

// prepare sizes the held population for rate and lets the operator work
// off the burst of new holdings (or a previous step's backlog).
func (m *mixRunner) prepare(ctx context.Context, rate float64) error {
	want := int(rate / 3 * m.held.renewEvery.Seconds())
	if churn := int(rate/3*(m.cfg.churnHold+m.cfg.warmup).Seconds()) + 100; want+churn > m.cfg.objects {
		return fmt.Errorf("%.0f writes/s needs %d held + ~%d churning locks, more than the %d objects: %w", rate, want, churn, m.cfg.objects, errTooFewObjects)
	}
	t0 := time.Now()
	err := m.held.resize(ctx, want)
	time.Sleep(min(time.Since(t0), m.cfg.warmup))
	return err
}

// window offers rate for a warm-up and a measured window and returns the
// step's result and its recorders; with a profile label it CPU-profiles the
// measured window (files named after the system and the label).
func (m *mixRunner) window(ctx context.Context, rate float64, profile string) (stepResult, *[3]*recorder) {
	cfg := m.cfg
	sr := stepResult{Offered: rate, Held: len(m.held.locks)}
	ws := time.Now().Add(cfg.warmup)
	we := ws.Add(cfg.measure)
	recs := &[3]*recorder{newRecorder(ws, we), newRecorder(ws, we), newRecorder(ws, we)}
	m.cur.Store(recs)
	var w0 writeCounts
	var cpu0 usage
	var profWG sync.WaitGroup
	w0done := make(chan struct{})
	go func() {
		defer close(w0done)
		time.Sleep(time.Until(ws))
		w0, _ = m.c.apiserverWrites(ctx)
		cpu0 = m.pw.snap()
		if profile != "" {
			sr.Profiles = startProfiles(ctx, m.c, &profWG, cfg, m.name+" "+profile)
		}
	}()
	var releases sync.WaitGroup
	openLoop(ctx, rate/3, time.Now(), we, cfg.maxInFlight, func(sched time.Time) {
		idx, ok := m.free.take()
		if !ok {
			recs[0].record(sched, errors.New("no free lock object left (raise --locks)"))
			return
		}
		h, err := m.sys.acquire(ctx, lockName(idx))
		recs[0].record(sched, err)
		if err != nil {
			m.held.giveBack(idx, err)
			return
		}
		releases.Go(func() {
			time.Sleep(cfg.churnHold)
			rs := time.Now()
			err := h.release(ctx)
			recs[2].record(rs, err)
			m.held.giveBack(idx, err)
		})
	}, func(sched time.Time) { recs[0].record(sched, errors.New("client-side in-flight limit reached")) })
	if d := time.Until(we); d > 0 {
		time.Sleep(d)
	}
	w1, _ := m.c.apiserverWrites(ctx)
	cpu1 := m.pw.snap()
	<-w0done
	releases.Wait()
	// Renewals scheduled inside the window may still be running.
	recs[1].drain(min(5*time.Second, m.held.renewEvery))
	profWG.Wait()
	m.cur.Store(nil)
	secs := cfg.measure.Seconds()
	sr.APIByKind = w1.since(w0, secs)
	sr.CPU = cpu1.since(cpu0).perSecond(secs)
	sr.APICPU = sr.CPU["kube-apiserver"]
	sr.summarize(recs, secs, cfg)
	return sr, recs
}

// summarize fills in the latencies, errors and verdict from recs over secs.
func (sr *stepResult) summarize(recs *[3]*recorder, secs float64, cfg mixConfig) {
	sr.APIWrites = sr.APIByKind.total()
	acq, _, _ := recs[0].snapshot()
	ren, _, _ := recs[1].snapshot()
	rel, _, _ := recs[2].snapshot()
	sr.Acquire, sr.Renew, sr.Release = summarize(acq), summarize(ren), summarize(rel)
	all, errs, kinds := merge(recs[0], recs[1], recs[2])
	sr.All, sr.Errors, sr.ErrKinds = summarize(all), errs, kinds
	sr.Achieved = float64(len(all)) / secs
	sr.Sustained = sr.Errors == 0 && sr.All.P99 <= cfg.p99Limit && sr.Achieved >= 0.9*sr.Offered
}

// runSeedMix searches for sys's highest sustained rate: coarse steps up to
// the first not sustained, then bisection (rateSearch).
func runSeedMix(ctx context.Context, c *cluster, sys locker, name string, free pool, cfg mixConfig, pw *procWatch, logf func(string, ...any)) *mixResult {
	res := &mixResult{System: name}
	start, cpu0 := time.Now(), pw.snap()
	defer func() { res.Wall, res.CPU = time.Since(start), pw.snap().since(cpu0) }()
	m := newMixRunner(c, sys, name, free, cfg, pw)
	// Give the held population back at the end.
	defer func() { _ = m.held.resize(ctx, 0) }()

	search := newRateSearch(cfg.rates, cfg.absTol, cfg.relTol, cfg.maxSteps)
	defer func() { res.Bracket = search.result() }()
	if len(cfg.rates) > 0 {
		m.prime(ctx, cfg.rates[0]/2)
	}
	for i := 0; ctx.Err() == nil; i++ {
		rate, ok := search.nextRate()
		if !ok {
			break
		}
		if err := m.prepare(ctx, rate); err != nil {
			logf("  %-16s step %d: %v: stopping", name, i+1, err)
			if !errors.Is(err, errTooFewObjects) {
				res.Steps = append(res.Steps, stepResult{Offered: rate, Held: len(m.held.locks), Errors: 1, ErrKinds: map[string]int{err.Error(): 1}})
			}
			break
		}
		profile := ""
		if i == cfg.profileStep {
			profile = fmt.Sprintf("seed-mix step %d", i+1)
		}
		sr, _ := m.window(ctx, rate, profile)
		res.Steps = append(res.Steps, sr)
		search.record(rate, sr.Sustained)
		logStep(name, fmt.Sprintf("step %d", i+1), sr)
	}
	logf("  %-16s seed mix: %s", name, search.result())
	return res
}

// prime offers rate once, unmeasured, before the search: a system just
// started (a fresh kubelock-apiserver replica, a new client's connections,
// caches and heap) is slower in its first seconds than later, and the
// search's first step would otherwise judge the start, not the system.
func (m *mixRunner) prime(ctx context.Context, rate float64) {
	if err := m.prepare(ctx, rate); err != nil {
		return // the first step says why
	}
	sr, _ := m.window(ctx, rate, "")
	logStep(m.name, "priming (not counted)", sr)
}

func logStep(name, what string, sr stepResult) {
	mark := "sustained"
	if !sr.Sustained {
		mark = "NOT sustained"
	}
	logf("  %-16s %s: offered %5.0f writes/s (%5d held) achieved %6.1f p50 %-8v p99 %-8v max %-8v errors %d apiserver writes/s %.0f, CPU %.0f%%: %s%s",
		name, what, sr.Offered, sr.Held, sr.Achieved, sr.All.P50.Round(time.Millisecond), sr.All.P99.Round(time.Millisecond),
		sr.All.Max.Round(time.Millisecond), sr.Errors, sr.APIWrites, 100*sr.APICPU, mark, firstKind(sr.ErrKinds))
	logf("  %-16s         apiserver writes/s by kind: %s", name, sr.APIByKind)
}

// runPairedStep offers the same seed-mix rate to several systems (one
// engine over different encodings) in alternating windows, ABBA… order so
// that a drifting machine load affects them alike. Every system keeps its
// held population renewing throughout, so each window also carries the
// others' renewals, the same for all. Each result merges its windows.
// With profile set, the first round's windows are CPU-profiled.
func runPairedStep(ctx context.Context, c *cluster, syss []locker, names []string, free pool, cfg mixConfig, pw *procWatch, rate float64, rounds int, profile bool) ([]stepResult, error) {
	runners := make([]*mixRunner, len(syss))
	acc := make([]*[3]*recorder, len(syss))
	sums := make([]stepResult, len(syss))
	forever := time.Now().Add(24 * time.Hour)
	// Give every held population back at the end.
	defer func() {
		for _, m := range runners {
			if m != nil {
				_ = m.held.resize(ctx, 0)
			}
		}
	}()
	for i := range syss {
		runners[i] = newMixRunner(c, syss[i], names[i], free, cfg, pw)
		if err := runners[i].prepare(ctx, rate); err != nil {
			return nil, err
		}
		acc[i] = &[3]*recorder{newRecorder(time.Time{}, forever), newRecorder(time.Time{}, forever), newRecorder(time.Time{}, forever)}
		sums[i] = stepResult{Offered: rate, APIByKind: writeCounts{}}
	}
	windows := 0
	for r := range max(1, rounds) {
		for k := range runners {
			i := k
			if r%2 == 1 {
				i = len(runners) - 1 - k
			}
			label := ""
			if profile && r == 0 {
				label = "paired step"
			}
			sr, recs := runners[i].window(ctx, rate, label)
			sums[i].Profiles = append(sums[i].Profiles, sr.Profiles...)
			for j := range recs {
				acc[i][j].absorb(recs[j])
			}
			sums[i].Held = sr.Held
			sums[i].APICPU += sr.APICPU
			for key, v := range sr.APIByKind {
				sums[i].APIByKind[key] += v
			}
		}
		windows++
	}
	for i := range sums {
		sums[i].APICPU /= float64(windows)
		for key := range sums[i].APIByKind {
			sums[i].APIByKind[key] /= float64(windows)
		}
		sums[i].summarize(acc[i], cfg.measure.Seconds()*float64(windows), cfg)
		logStep(names[i], fmt.Sprintf("paired step (%d windows)", windows), sums[i])
	}
	return sums, nil
}

func firstKind(k map[string]int) string {
	for s, n := range k {
		return fmt.Sprintf(" (%d× %s)", n, s)
	}
	return ""
}

// startProfiles takes CPU profiles of kube-apiserver and of this process for
// the measured window; they are done when wg is.
func startProfiles(ctx context.Context, c *cluster, wg *sync.WaitGroup, cfg mixConfig, name string) []string {
	if cfg.profileDir == "" {
		return nil
	}
	api := filepath.Join(cfg.profileDir, name+"-apiserver.pprof")
	self := filepath.Join(cfg.profileDir, name+"-client.pprof")
	d := cfg.measure
	wg.Go(func() {
		if err := c.apiserverProfile(ctx, d, api); err != nil {
			c.logf("apiserver profile: %v", err)
		}
	})
	f, err := os.Create(self)
	if err == nil {
		if err := pprof.StartCPUProfile(f); err == nil {
			wg.Go(func() {
				time.Sleep(d)
				pprof.StopCPUProfile()
				_ = f.Close()
			})
		} else {
			_ = f.Close()
		}
	}
	return []string{api, self}
}
