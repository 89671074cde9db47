package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/pprof/profile"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/controllers"
	childproc "github.com/kubelock/kubelock/internal/proc"
	"github.com/kubelock/kubelock/pkg/lock"
)

// Workload "scale": the operator with every lock object of the run in its
// cache. It measures the operator's memory with none of them held, with a
// held population renewing, and after a restart (when the informer lists
// every lock at once and the controller reconciles each); and the lateness of
// expiries of leases that lapse meanwhile, in steady state and right after
// the restart, when the controller's queue holds every lock.

// The budget's targets at scale, reported against the figures: the
// operator's peak RSS, and how long after its lease and grace a lapsed
// holding may stay held.
const (
	scaleRSSTarget   = 300 << 20
	lapseSlackTarget = 500 * time.Millisecond
)

// scaleLabel marks the locks whose leases lapse, so the benchmark watches
// only them.
const scaleLabel = "bench.kubelock.io/lapse"

type scaleConfig struct {
	locks      int // lock objects that exist (the seed mix's)
	held       int // of them held, renewed every holdLease/3
	holdLease  time.Duration
	lapses     int // leases that lapse in each round
	lapseLease time.Duration
	lapseOver  time.Duration // the lapsing acquisitions are spread over this
	holdRate   float64       // acquisitions/s of the held population
	workers    int           // acquiring it, each one acquire at a time
	grace      time.Duration // the operator's --expiry-grace
}

// memPoint is the operator's memory at one moment, and the other
// processes' the backend runs.
type memPoint struct {
	Label     string
	RSS, Peak int64 // VmRSS and VmHWM (peak since the process started)
	Others    []procMem
	HeapInuse float64 // go_memstats_heap_inuse_bytes
	Objects   float64 // go_memstats_heap_objects
	// Live is the live heap after a forced GC (the heap profile's inuse
	// bytes); Heap the profile's file.
	Live int64
	Heap string
}

// lapseRound is the lateness of expiries: from each lapsing lease's end to
// the benchmark's watch seeing the controller's write that ended it.
type lapseRound struct {
	Label string
	Lat   []time.Duration
	Dist  dist
	// Decided: from each lease's end to the endTime the controller wrote
	// (its clock when it decided; the same host's wall clock as the client's).
	Decided dist
	// Acquire: how long each lapsing holding's TryAcquire took (its read and
	// write); the controller can only start timing once the write committed.
	Acquire dist
	// FromReturn: from each TryAcquire's return plus the lease to the watch
	// seeing the expiry: the lateness the acquiring call's latency does not
	// explain (the write committed before it returned).
	FromReturn dist
	Missed     int // not seen expired within the round's deadline
	Events     int // lock events the informer delivered during the round
	// QueueP50, QueueP99: how long locks waited in the controller's work
	// queue during the round (bucket upper bounds; -1: beyond the last).
	QueueP50, QueueP99 time.Duration
	// DelayP50, DelayP99: how late after their deadlines on the controller's
	// clock it expired holdings during the round (its own histogram; after a
	// restart the new process's, which counts only this round).
	DelayP50, DelayP99 time.Duration
	Errors             int
	ErrKinds           map[string]int
}

// procMem is one process's VmRSS and VmHWM.
type procMem struct {
	Name      string
	RSS, Peak int64
}

type scaleResult struct {
	// Backend says where the locks are served from and stored.
	Backend  string
	Cfg      scaleConfig
	Held     int
	HoldTime time.Duration
	HoldErrs map[string]int
	Points   []memPoint
	Rounds   []lapseRound
	// From the restarted operator's start: leading, every lock listed and
	// queued, and its queue empty.
	ToLeader, ToListed, ToIdle time.Duration
	MaxRSS                     int64 // highest VmRSS sampled (every 250 ms) after the restart
	// With the lock apiserver: a replica started at this scale (its watch
	// cache listed from the lock store) served after NewReplica, and its
	// memory then.
	NewReplica    time.Duration
	NewReplicaMem procMem
	Err           string
}

// runScale runs workload scale on c, whose locks backend serves; others are
// the backend's processes besides kube-apiserver whose memory it records.
func runScale(ctx context.Context, c *cluster, backend string, free pool, cfg scaleConfig, others []proc, logf func(string, ...any)) *scaleResult {
	res := &scaleResult{Backend: backend, Cfg: cfg, HoldErrs: map[string]int{}}
	if err := scale(ctx, c, free, cfg, others, res, logf); err != nil {
		res.Err = err.Error()
		logf("  scale: %v", err)
	}
	return res
}

func scale(ctx context.Context, c *cluster, free pool, cfg scaleConfig, others []proc, res *scaleResult, logf func(string, ...any)) error {
	if err := c.waitQueueEmpty(ctx, cfg.locks, 5*time.Minute); err != nil {
		return err
	}
	res.Points = append(res.Points, c.memPoint(ctx, others, fmt.Sprintf("%d locks, none held", cfg.locks)))
	logPoint(logf, res.Points[len(res.Points)-1])

	// The held population, renewed by pkg/lock's own background renewal.
	holdCtx, stopHolding := context.WithCancel(ctx)
	defer stopHolding()
	cl, err := lock.New(c.user, lock.WithNamespace(lockNS), lock.WithIdentity("scale-holder"), lock.WithLeaseDuration(cfg.holdLease))
	if err != nil {
		return err
	}
	start := time.Now()
	var held atomic.Int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	// At a steady rate, as the seed mix offers writes: a burst of
	// acquisitions as fast as the apiserver answers starves everything else
	// on a small machine, the operator's leader election included.
	tick := time.NewTicker(time.Duration(float64(time.Second) / cfg.holdRate))
	defer tick.Stop()
	for range cfg.workers {
		wg.Go(func() {
			for held.Load() < int64(cfg.held) && holdCtx.Err() == nil && c.operatorAlive() == nil {
				select {
				case <-tick.C:
				case <-holdCtx.Done():
					return
				}
				idx, ok := free.take()
				if !ok {
					return
				}
				if _, err := cl.TryAcquire(holdCtx, lockName(idx)); err != nil {
					mu.Lock()
					res.HoldErrs[errKind(err)]++
					mu.Unlock()
					continue
				}
				held.Add(1)
			}
		})
	}
	wg.Wait()
	res.HoldTime, res.Held = time.Since(start), int(held.Load())
	if err := c.operatorAlive(); err != nil {
		return err
	}
	logf("  scale: %d locks held in %s (%.0f/s), errors %s", res.Held, res.HoldTime.Round(time.Millisecond), float64(res.Held)/res.HoldTime.Seconds(), kindsString(res.HoldErrs))
	if err := c.waitQueueEmpty(ctx, cfg.locks, 5*time.Minute); err != nil {
		return err
	}
	res.Points = append(res.Points, c.memPoint(ctx, others, fmt.Sprintf("%d locks, %d held", cfg.locks, res.Held)))
	logPoint(logf, res.Points[len(res.Points)-1])

	lw, err := watchLapses(ctx, c)
	if err != nil {
		return err
	}
	defer lw.stop()
	res.Rounds = append(res.Rounds, runLapses(ctx, c, lw, cfg, "steady state"))
	logRound(logf, res.Rounds[len(res.Rounds)-1])

	// A new leader lists every lock at once and reconciles each; leases
	// lapsing meanwhile show whether expiries wait behind that.
	samples := sampleRSS(ctx, c)
	started, err := c.restartManager(ctx)
	if err != nil {
		return err
	}
	if err := c.mgr.WaitFor(ctx, "leading", 3*time.Minute, func(ctx context.Context) error {
		body, err := httpGet(ctx, c.mgrMetrics)
		if err != nil {
			return err
		}
		if sumMetric(body, "kubelock_controller_is_leader", nil) != 1 {
			return errors.New("not leading yet")
		}
		return nil
	}); err != nil {
		return err
	}
	res.ToLeader = time.Since(started)
	if err := c.waitListed(ctx, cfg.locks, 10*time.Minute); err != nil {
		return err
	}
	res.ToListed = time.Since(started)
	var round lapseRound
	var rw sync.WaitGroup
	rw.Go(func() { round = runLapses(ctx, c, lw, cfg, "after a restart, behind the relisted locks") })
	if err := c.waitQueueEmpty(ctx, cfg.locks, 10*time.Minute); err != nil {
		return err
	}
	res.ToIdle = time.Since(started)
	rw.Wait()
	res.Rounds = append(res.Rounds, round)
	logRound(logf, round)
	res.MaxRSS = samples()
	res.Points = append(res.Points, c.memPoint(ctx, others, fmt.Sprintf("restarted with %d locks, %d held", cfg.locks, res.Held)))
	logPoint(logf, res.Points[len(res.Points)-1])
	logf("  scale: restarted operator leading after %s, every lock listed after %s, queue empty after %s, highest RSS sampled %s",
		res.ToLeader.Round(time.Millisecond), res.ToListed.Round(time.Millisecond), res.ToIdle.Round(time.Millisecond), mib(res.MaxRSS))
	return nil
}

// lockQueue reads the lock controller's work queue: locks ever added, and
// queued now.
func (c *cluster) lockQueue(ctx context.Context) (adds, depth float64, err error) {
	body, err := httpGet(ctx, c.mgrMetrics)
	if err != nil {
		return 0, 0, err
	}
	mine := func(l map[string]string) bool { return l["name"] == controllers.ControllerName }
	sumMetric(body, "workqueue_adds_total", func(l map[string]string, v float64) {
		if mine(l) {
			adds += v
		}
	})
	sumMetric(body, "workqueue_depth", func(l map[string]string, v float64) {
		if mine(l) {
			depth += v
		}
	})
	return adds, depth, nil
}

// histogram reads the operator's histogram name (the series labels accepts):
// upper bound → cumulative count.
func (c *cluster) histogram(ctx context.Context, name string, accept func(map[string]string) bool) map[float64]float64 {
	h := map[float64]float64{}
	body, err := httpGet(ctx, c.mgrMetrics)
	if err != nil {
		return h
	}
	sumMetric(body, name+"_bucket", func(l map[string]string, v float64) {
		if !accept(l) {
			return
		}
		le, err := strconv.ParseFloat(l["le"], 64)
		if err != nil {
			le = math.Inf(1)
		}
		h[le] += v
	})
	return h
}

// queueWait is how long locks waited in the lock controller's work queue
// (workqueue_queue_duration_seconds); expiryDelay how late after their
// deadlines it expired holdings (kubelock_controller_expiry_delay_seconds).
func (c *cluster) queueWait(ctx context.Context) map[float64]float64 {
	return c.histogram(ctx, "workqueue_queue_duration_seconds", func(l map[string]string) bool { return l["name"] == controllers.ControllerName })
}

func (c *cluster) expiryDelay(ctx context.Context) map[float64]float64 {
	return c.histogram(ctx, "kubelock_controller_expiry_delay_seconds", func(map[string]string) bool { return true })
}

// waitQuantile is the upper bound of the bucket holding quantile q of the
// waits counted between two readings of queueWait.
func waitQuantile(before, after map[float64]float64, q float64) time.Duration {
	les := slices.Sorted(maps.Keys(after))
	if len(les) == 0 {
		return 0
	}
	total := after[les[len(les)-1]] - before[les[len(les)-1]]
	if total <= 0 {
		return 0
	}
	for _, le := range les {
		if after[le]-before[le] >= q*total {
			if math.IsInf(le, 1) {
				return -1
			}
			return time.Duration(le * float64(time.Second))
		}
	}
	return -1
}

// waitListed waits until the lock controller (of this operator process) has
// queued at least n locks: its informer delivered its initial list.
func (c *cluster) waitListed(ctx context.Context, n int, timeout time.Duration) error {
	return c.mgr.WaitFor(ctx, "its lock informer listed", timeout, func(ctx context.Context) error {
		adds, _, err := c.lockQueue(ctx)
		if err != nil {
			return err
		}
		if adds < float64(n) {
			return fmt.Errorf("%.0f of %d locks queued", adds, n)
		}
		return nil
	})
}

// waitQueueEmpty waits until the lock controller has queued at least n locks
// and its queue has held nothing for a second: it caught up with every change.
func (c *cluster) waitQueueEmpty(ctx context.Context, n int, timeout time.Duration) error {
	var emptySince time.Time
	return c.mgr.WaitFor(ctx, "an empty lock queue", timeout, func(ctx context.Context) error {
		adds, depth, err := c.lockQueue(ctx)
		switch {
		case err != nil:
			return err
		case adds < float64(n) || depth > 0:
			emptySince = time.Time{}
			return fmt.Errorf("%.0f of %d locks queued, %.0f waiting", adds, n, depth)
		case emptySince.IsZero():
			emptySince = time.Now()
		}
		if time.Since(emptySince) < time.Second {
			return errors.New("queue empty for less than a second")
		}
		return nil
	})
}

func (c *cluster) memPoint(ctx context.Context, others []proc, label string) memPoint {
	p := memPoint{Label: label}
	p.RSS, p.Peak = proc{pid: c.mgr.Pid()}.mem()
	for _, o := range others {
		m := procMem{Name: o.name}
		m.RSS, m.Peak = o.mem()
		p.Others = append(p.Others, m)
	}
	if body, err := httpGet(ctx, c.mgrMetrics); err == nil {
		p.HeapInuse = sumMetric(body, "go_memstats_heap_inuse_bytes", nil)
		p.Objects = sumMetric(body, "go_memstats_heap_objects", nil)
	}
	c.heapProfiles++
	path := filepath.Join(c.dir, fmt.Sprintf("operator-heap-%d.pprof", c.heapProfiles))
	if body, err := httpGet(ctx, c.mgrPprof+"/heap?gc=1"); err == nil && os.WriteFile(path, body, 0o644) == nil {
		p.Heap = path
		if prof, err := profile.Parse(bytes.NewReader(body)); err == nil {
			p.Live = inuse(prof)
		}
	}
	return p
}

// inuse sums the in-use bytes of a heap profile's samples whose stack
// (innermost frame first) keep accepts.
func inuse(prof *profile.Profile) int64 {
	var sum int64
	for _, v := range inuseBy(prof, func([]string) string { return "" }) {
		sum += v
	}
	return sum
}

// inuseBy sums a heap profile's in-use bytes by the key each sample's frames
// (innermost first) give.
func inuseBy(prof *profile.Profile, key func(frames []string) string) map[string]int64 {
	by := map[string]int64{}
	vi := slices.IndexFunc(prof.SampleType, func(t *profile.ValueType) bool { return t.Type == "inuse_space" })
	if vi < 0 {
		return by
	}
	for _, sm := range prof.Sample {
		by[key(frames(sm))] += sm.Value[vi]
	}
	return by
}

func frames(sm *profile.Sample) []string {
	var out []string
	for _, loc := range sm.Location {
		for _, ln := range loc.Line {
			if ln.Function != nil {
				out = append(out, ln.Function.Name)
			}
		}
	}
	return out
}

// heapHolders are what keeps the operator's live heap: an allocation counts
// for the first of them (in this order) that a frame of its stack names.
var heapHolders = []struct{ name, match string }{
	{"decoded locks (the informers' watch decoding)", "client-go/rest/watch.(*Decoder).Decode|kubelock/controllers.(*cachedLock).UnmarshalJSON"},
	{"the informers' stores and indexes", "tools/cache.(*threadSafeMap)|tools/cache.(*storeIndex)|tools/cache.(*DeltaFIFO)|tools/cache.(*Reflector)"},
	{"the controller's observations", "kubelock/controllers.(*observations)|kubelock/controllers.observe"},
	{"the work queue", "controller-runtime/pkg/controller/priorityqueue|client-go/util/workqueue"},
	{"informer event buffers", "tools/cache.(*processorListener)"},
	{"reconciling", "kubelock/controllers.(*Reconciler)"},
	{"the admission webhook", "kubelock/webhook|controller-runtime/pkg/webhook"},
	{"metrics", "prometheus/client_golang|kubelock/internal/metrics"},
}

// heapHolder names the first of heapHolders that one of frames names.
func heapHolder(frames []string) string {
	for _, h := range heapHolders {
		for _, m := range strings.Split(h.match, "|") {
			if slices.ContainsFunc(frames, func(f string) bool { return strings.Contains(f, m) }) {
				return h.name
			}
		}
	}
	return "other"
}

// heapSummary is the live heap of a profile by holder.
func heapSummary(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer func() { _ = f.Close() }()
	prof, err := profile.Parse(f)
	if err != nil {
		return err.Error()
	}
	by := inuseBy(prof, heapHolder)
	var total int64
	for _, v := range by {
		total += v
	}
	if total == 0 {
		return "empty"
	}
	names := slices.SortedFunc(maps.Keys(by), func(a, b string) int { return cmp.Or(cmp.Compare(by[b], by[a]), cmp.Compare(a, b)) })
	var parts []string
	for _, n := range names {
		if by[n] > 0 {
			parts = append(parts, fmt.Sprintf("%s %s (%.0f%%)", n, mib(by[n]), 100*float64(by[n])/float64(total)))
		}
	}
	return strings.Join(parts, ", ")
}

// sampleRSS reads the operator's VmRSS every 250 ms (whichever process
// c.mgr is) until the returned function is called, which returns the highest.
func sampleRSS(ctx context.Context, c *cluster) func() int64 {
	sctx, cancel := context.WithCancel(ctx)
	var highest atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			if rss, _ := (proc{pid: c.mgrPid()}).mem(); rss > highest.Load() {
				highest.Store(rss)
			}
			select {
			case <-sctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return func() int64 {
		cancel()
		<-done
		return highest.Load()
	}
}

// restartManager stops the operator (SIGTERM: it releases its leader Lease)
// and starts the same binary with the same flags; it returns when the new
// process started.
func (c *cluster) restartManager(ctx context.Context) (time.Time, error) {
	if err := c.mgr.Stop(10 * time.Second); err != nil {
		return time.Time{}, fmt.Errorf("stopping the operator: %w", err)
	}
	c.restarts++
	started := time.Now()
	m, err := childproc.Start("manager", c.mgrArgs[0], filepath.Join(c.dir, fmt.Sprintf("manager-%d.log", c.restarts)), c.mgrArgs[1:]...)
	if err != nil {
		return started, err
	}
	c.mgrMu.Lock()
	c.mgr = m
	c.mgrMu.Unlock()
	return started, nil
}

func (c *cluster) mgrPid() int {
	c.mgrMu.Lock()
	defer c.mgrMu.Unlock()
	return c.mgr.Pid()
}

// lapseWatch sees the controller's expiry writes on the lapsing locks,
// through an informer (which lists and watches again whenever its watch ends).
type lapseWatch struct {
	mu      sync.Mutex
	expired map[string]time.Time // leaseID → when the informer saw it expired
	ended   map[string]time.Time // leaseID → the controller's endTime for it
	events  int
	seen    chan struct{}
	stop    func()
}

func watchLapses(ctx context.Context, c *cluster) (*lapseWatch, error) {
	wctx, cancel := context.WithCancel(ctx)
	ic, err := cache.New(c.admin, cache.Options{Scheme: c.env.Scheme, DefaultNamespaces: map[string]cache.Config{lockNS: {}},
		DefaultLabelSelector: labels.SelectorFromSet(labels.Set{scaleLabel: "true"})})
	if err != nil {
		cancel()
		return nil, err
	}
	inf, err := ic.GetInformer(wctx, &locksv1alpha1.DistributedLock{})
	if err != nil {
		cancel()
		return nil, err
	}
	lw := &lapseWatch{expired: map[string]time.Time{}, ended: map[string]time.Time{}, seen: make(chan struct{}, 1), stop: cancel}
	see := func(obj any) {
		l, ok := obj.(*locksv1alpha1.DistributedLock)
		if !ok {
			return
		}
		now := time.Now()
		lw.mu.Lock()
		lw.events++
		for _, f := range l.Status.RecentAcquisitions {
			if _, dup := lw.expired[f.LeaseID]; f.EndReason == locksv1alpha1.EndReasonExpired && !dup {
				lw.expired[f.LeaseID], lw.ended[f.LeaseID] = now, f.EndTime.Time
			}
		}
		lw.mu.Unlock()
		select {
		case lw.seen <- struct{}{}:
		default:
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: see, UpdateFunc: func(_, n any) { see(n) }}); err != nil {
		cancel()
		return nil, err
	}
	go func() { _ = ic.Start(wctx) }()
	if !ic.WaitForCacheSync(wctx) {
		cancel()
		return nil, errors.New("the lapsing locks' informer did not sync")
	}
	return lw, nil
}

// expiredAt is when the informer saw the holding leaseID expired, and the
// time the controller wrote as its end.
func (lw *lapseWatch) expiredAt(leaseID string) (seen, ended time.Time, ok bool) {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	seen, ok = lw.expired[leaseID]
	return seen, lw.ended[leaseID], ok
}

// runLapses acquires cfg.lapses labeled locks, spread over cfg.lapseOver,
// with a lease of cfg.lapseLease that nobody renews, and measures from each
// lease's end to the watch seeing it expired.
func runLapses(ctx context.Context, c *cluster, lw *lapseWatch, cfg scaleConfig, label string) (r lapseRound) {
	r = lapseRound{Label: label, ErrKinds: map[string]int{}}
	wait0, delay0 := c.queueWait(ctx), c.expiryDelay(ctx)
	defer func() {
		wait1, delay1 := c.queueWait(ctx), c.expiryDelay(ctx)
		r.QueueP50, r.QueueP99 = waitQuantile(wait0, wait1, 0.5), waitQuantile(wait0, wait1, 0.99)
		r.DelayP50, r.DelayP99 = waitQuantile(delay0, delay1, 0.5), waitQuantile(delay0, delay1, 0.99)
	}()
	lw.mu.Lock()
	events0 := lw.events
	lw.mu.Unlock()
	defer func() {
		lw.mu.Lock()
		r.Events = lw.events - events0
		lw.mu.Unlock()
	}()
	cl, err := lock.New(c.user, lock.WithNamespace(lockNS), lock.WithIdentity("scale-lapse"), lock.WithoutAutoRenew())
	if err != nil {
		r.Errors++
		r.ErrKinds[errKind(err)]++
		return r
	}
	type lapse struct {
		leaseID  string
		end      time.Time
		acquire  time.Duration
		returned time.Time
	}
	var mu sync.Mutex
	var lapses []lapse
	start := time.Now()
	var wg sync.WaitGroup
	for i := range cfg.lapses {
		at := start.Add(time.Duration(i) * cfg.lapseOver / time.Duration(max(cfg.lapses, 1)))
		time.Sleep(time.Until(at))
		wg.Go(func() {
			err := func() error {
				key := fmt.Sprintf("lapse-%05d", i)
				err := c.env.Client.Create(ctx, &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: lockNS, Name: key, Labels: map[string]string{scaleLabel: "true"}}})
				if ignoreExists(err) != nil {
					return err
				}
				sent := time.Now()
				l, err := cl.TryAcquire(ctx, key, lock.WithLeaseDuration(cfg.lapseLease))
				if err != nil {
					return err
				}
				returned := time.Now()
				// ExpiresAt is the acquiring write's send time plus the lease
				// minus the client's safety margin.
				mu.Lock()
				lapses = append(lapses, lapse{l.LeaseID(), l.ExpiresAt().Add(lock.SafetyMargin(cfg.lapseLease)), returned.Sub(sent), returned})
				mu.Unlock()
				return nil
			}()
			if err != nil {
				mu.Lock()
				r.Errors++
				r.ErrKinds[errKind(err)]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	deadline := time.Now().Add(cfg.lapseLease + cfg.grace + time.Minute)
	for {
		pending := 0
		for _, l := range lapses {
			if _, _, ok := lw.expiredAt(l.leaseID); !ok {
				pending++
			}
		}
		if pending == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			r.Missed = pending
			break
		}
		select {
		case <-lw.seen:
		case <-time.After(time.Second):
		}
	}
	var decided, acquired, fromReturn []time.Duration
	for _, l := range lapses {
		acquired = append(acquired, l.acquire)
		if seen, ended, ok := lw.expiredAt(l.leaseID); ok {
			r.Lat = append(r.Lat, seen.Sub(l.end))
			decided = append(decided, ended.Sub(l.end))
			fromReturn = append(fromReturn, seen.Sub(l.returned.Add(cfg.lapseLease)))
		}
	}
	r.Dist, r.Decided, r.Acquire, r.FromReturn = summarize(r.Lat), summarize(decided), summarize(acquired), summarize(fromReturn)
	return r
}

func logPoint(logf func(string, ...any), p memPoint) {
	logf("  scale: %s: operator RSS %s (peak %s), Go heap in use %s, live %s, %.0f heap objects", p.Label, mib(p.RSS), mib(p.Peak), mib(int64(p.HeapInuse)), mib(p.Live), p.Objects)
	for _, o := range p.Others {
		logf("  scale: %s: %s RSS %s (peak %s)", p.Label, o.Name, mib(o.RSS), mib(o.Peak))
	}
	if p.Heap != "" {
		logf("  scale: live heap: %s", heapSummary(p.Heap))
	}
}

func logRound(logf func(string, ...any), r lapseRound) {
	logf("  scale: expiry lateness (%s): %d expired, seen p50 %v p99 %v max %v, decided p50 %v p99 %v max %v, missed %d, errors %d%s (%d lock events seen)", r.Label, r.Dist.N,
		r.Dist.P50.Round(time.Millisecond), r.Dist.P99.Round(time.Millisecond), r.Dist.Max.Round(time.Millisecond),
		r.Decided.P50.Round(time.Millisecond), r.Decided.P99.Round(time.Millisecond), r.Decided.Max.Round(time.Millisecond), r.Missed, r.Errors, firstKind(r.ErrKinds), r.Events)
	logf("  scale: TryAcquire took p50 %v p99 %v max %v; from its return + lease, seen p50 %v p99 %v max %v; locks waited in the controller's queue p50 ≤ %v, p99 ≤ %v; its expiries came after their deadlines p50 ≤ %v, p99 ≤ %v",
		r.Acquire.P50.Round(time.Millisecond), r.Acquire.P99.Round(time.Millisecond), r.Acquire.Max.Round(time.Millisecond),
		r.FromReturn.P50.Round(time.Millisecond), r.FromReturn.P99.Round(time.Millisecond), r.FromReturn.Max.Round(time.Millisecond), r.QueueP50, r.QueueP99, r.DelayP50, r.DelayP99)
}

// markdown is the workload's section of the report.
func (s *scaleResult) markdown() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	cfg := s.Cfg
	p("\n## The operator at %d locks, on %s\n\n", cfg.locks, s.Backend)
	p("With the %d lock objects of the run in the operator's cache: %d of them acquired (at most %.0f/s: %d in %s, %.0f/s; errors: %s) and held with a %s lease that pkg/lock renews every %s. "+
		"Memory from `/proc/<pid>/status` (VmRSS; VmHWM is the peak since the process started) and the operator's `go_memstats_*`. "+
		"Then the operator is restarted (SIGTERM, the same binary and flags): the new leader lists every lock at once and reconciles each.\n\n",
		cfg.locks, cfg.held, cfg.holdRate, s.Held, s.HoldTime.Round(time.Second), float64(s.Held)/max(s.HoldTime.Seconds(), 1e-9), kindsString(s.HoldErrs), cfg.holdLease, cfg.holdLease/3)
	var others []procMem
	if len(s.Points) > 0 {
		others = s.Points[0].Others
	}
	p("| moment | RSS | peak RSS (VmHWM) | Go heap in use | live heap after GC | heap objects |")
	for _, o := range others {
		p(" %s RSS (peak) |", o.Name)
	}
	p("\n|---|---:|---:|---:|---:|---:|%s\n", strings.Repeat("---:|", len(others)))
	for _, pt := range s.Points {
		p("| %s | %s | %s | %s | %s | %.0f |", pt.Label, mib(pt.RSS), mib(pt.Peak), mib(int64(pt.HeapInuse)), mib(pt.Live), pt.Objects)
		for _, o := range pt.Others {
			p(" %s (%s) |", mib(o.RSS), mib(o.Peak))
		}
		p("\n")
	}
	if s.NewReplica > 0 {
		p("\nA kubelock-apiserver replica started on the same store at this scale served after %s (from its start: it lists every object of the lock store into its watch cache before it serves), with an RSS of %s (peak %s).\n",
			s.NewReplica.Round(time.Millisecond), mib(s.NewReplicaMem.RSS), mib(s.NewReplicaMem.Peak))
	}
	p("\nThe live heap by what holds it (the heap profile after a forced GC, `/debug/pprof/heap?gc=1` of `--pprof-bind-address`):\n\n")
	for _, pt := range s.Points {
		if pt.Heap != "" {
			p("- %s: %s\n", pt.Label, heapSummary(pt.Heap))
		}
	}
	if s.MaxRSS > 0 {
		p("\nThe restarted operator led after %s, had every lock listed and queued after %s, and had reconciled them all (its queue empty for a second) after %s; highest RSS sampled every 250 ms meanwhile: %s. "+
			"The second expiry round starts once every lock is queued, so its leases lapse while the controller works through them.\n",
			s.ToLeader.Round(time.Millisecond), s.ToListed.Round(time.Millisecond), s.ToIdle.Round(time.Millisecond), mib(s.MaxRSS))
	}
	p("\n**Expiry at %d locks.** In each round %d locks are acquired over %s with a %s lease that nobody renews; lateness is from each lease's end (the client's `ExpiresAt()` plus its safety margin) to a watch of those locks seeing the controller's write that expired it. "+
		"The controller waits the lease plus `--expiry-grace` (%s) after the last renewal it observed, so the target, expiry within lease + grace + %s, is lateness ≤ %s.\n\n",
		cfg.locks, cfg.lapses, cfg.lapseOver, cfg.lapseLease, cfg.grace, lapseSlackTarget, cfg.grace+lapseSlackTarget)
	p("\"decided\": to the `endTime` the controller wrote, its clock when it decided (the same host's wall clock as the client's), so the difference from \"seen\" is the status write and the watch back.\n\n")
	p("\"acquire\": how long each lapsing holding's `TryAcquire` took (its read and its write): the lease ends at the write's send plus the lease, but the controller can only see the holding once the write committed. \"from return\": from `TryAcquire`'s return plus the lease to the watch seeing the expiry, the lateness that the acquiring call's own latency does not explain (ideally the grace).\n\n")
	p("\"queue\": how long locks (all of them, not only these) waited in the controller's work queue during the round, `workqueue_queue_duration_seconds`; \"controller late\": how long after each holding's deadline on the controller's own clock (the last renewal as its cache received it, + lease + grace) its expiring write committed, `kubelock_controller_expiry_delay_seconds` (both bucket upper bounds).\n\n")
	p("| round | expired | seen p50 | p95 | p99 | max | decided p50 | p99 | max | acquire p50 | p99 | from return p50 | p99 | max | queue p50 | p99 | controller late p50 | p99 | missed | errors |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range s.Rounds {
		p("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %d | %d%s |\n", r.Label, r.Dist.N, ms(r.Dist.P50), ms(r.Dist.P95), ms(r.Dist.P99), ms(r.Dist.Max),
			ms(r.Decided.P50), ms(r.Decided.P99), ms(r.Decided.Max), ms(r.Acquire.P50), ms(r.Acquire.P99),
			ms(r.FromReturn.P50), ms(r.FromReturn.P99), ms(r.FromReturn.Max), bucketMS(r.QueueP50), bucketMS(r.QueueP99), bucketMS(r.DelayP50), bucketMS(r.DelayP99), r.Missed, r.Errors, firstKind(r.ErrKinds))
	}
	p("\n| target | figure | met |\n|---|---|---|\n")
	for _, t := range s.targets() {
		p("| %s | %s | %s |\n", t.target, t.figure, met(t.met))
	}
	if s.Err != "" {
		p("\nThe workload stopped early: %s\n", s.Err)
	}
	return b.String()
}

// targets are the budget's targets this workload measures: the operator's
// peak RSS and each round's expiry lateness.
func (s *scaleResult) targets() []targetRow {
	cfg := s.Cfg
	var peak int64
	for _, pt := range s.Points {
		peak = max(peak, pt.RSS, pt.Peak)
	}
	peak = max(peak, s.MaxRSS)
	rows := []targetRow{{
		target: fmt.Sprintf("operator RSS ≤ %s at %d locks, on %s", mib(scaleRSSTarget), cfg.locks, s.Backend),
		figure: "peak " + mib(peak),
		met:    peak > 0 && peak <= scaleRSSTarget,
	}}
	for _, r := range s.Rounds {
		rows = append(rows, targetRow{
			target: fmt.Sprintf("expiry within lease + grace + %s at %d locks, on %s (%s)", lapseSlackTarget, cfg.locks, s.Backend, r.Label),
			figure: fmt.Sprintf("max %s ms late (p99 %s)", ms(r.Dist.Max), ms(r.Dist.P99)),
			met:    r.Dist.N > 0 && r.Missed == 0 && r.Errors == 0 && r.Dist.Max <= cfg.grace+lapseSlackTarget,
		})
	}
	return rows
}

// bucketMS is a histogram bucket's upper bound in milliseconds.
func bucketMS(d time.Duration) string {
	switch {
	case d < 0:
		return "beyond the last bucket"
	case d == 0:
		return "–"
	}
	return "≤ " + ms(d)
}

// met shows whether a target was met, a miss in bold.
func met(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}
