package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kubelock/kubelock/test/procstat"
)

// recorder collects latencies of operations whose scheduled time falls in
// [from, to): the measured window after the warm-up.
type recorder struct {
	from, to time.Time
	mu       sync.Mutex
	lat      []time.Duration
	errs     int
	kinds    map[string]int
	pending  atomic.Int64 // operations begun (begin) in the window, not yet recorded
}

func newRecorder(from, to time.Time) *recorder {
	return &recorder{from: from, to: to, kinds: map[string]int{}}
}

// record notes one operation scheduled at sched that ended now.
func (r *recorder) record(sched time.Time, err error) {
	if r == nil || sched.Before(r.from) || !sched.Before(r.to) {
		return
	}
	d := time.Since(sched)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.errs++
		r.kinds[errKind(err)]++
		return
	}
	r.lat = append(r.lat, d)
}

// begin notes an operation scheduled at sched that is about to run and
// returns what records it: drain waits for the ones in the window.
func (r *recorder) begin(sched time.Time) func(err error) {
	if r == nil || sched.Before(r.from) || !sched.Before(r.to) {
		return func(error) {}
	}
	r.pending.Add(1)
	return func(err error) {
		r.record(sched, err)
		r.pending.Add(-1)
	}
}

// drain waits, at most limit, until every operation begun in the window has
// been recorded, so that the window's tail is neither lost nor waited for
// longer than it takes.
func (r *recorder) drain(limit time.Duration) {
	deadline := time.Now().Add(limit)
	for r.pending.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
}

// absorb adds everything other recorded.
func (r *recorder) absorb(other *recorder) {
	lat, errs, kinds := other.snapshot()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lat = append(r.lat, lat...)
	r.errs += errs
	for k, v := range kinds {
		r.kinds[k] += v
	}
}

// add records a latency measured elsewhere (hand-off, expiry).
func (r *recorder) add(d time.Duration, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.errs++
		r.kinds[errKind(err)]++
		return
	}
	r.lat = append(r.lat, d)
}

func errKind(err error) string {
	s := err.Error()
	if len(s) > 120 {
		s = s[:120]
	}
	return s
}

func (r *recorder) snapshot() ([]time.Duration, int, map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	kinds := map[string]int{}
	for k, v := range r.kinds {
		kinds[k] = v
	}
	return slices.Clone(r.lat), r.errs, kinds
}

// merge combines recorders (the operations of one seed-mix step).
func merge(rs ...*recorder) ([]time.Duration, int, map[string]int) {
	var all []time.Duration
	errs := 0
	kinds := map[string]int{}
	for _, r := range rs {
		l, e, k := r.snapshot()
		all = append(all, l...)
		errs += e
		for kk, v := range k {
			kinds[kk] += v
		}
	}
	return all, errs, kinds
}

// dist is a latency distribution's summary.
type dist struct {
	N                        int
	P50, P95, P99, P999, Max time.Duration
}

func summarize(lat []time.Duration) dist {
	if len(lat) == 0 {
		return dist{}
	}
	s := slices.Sorted(slices.Values(lat))
	q := func(p float64) time.Duration {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return s[max(0, min(i, len(s)-1))]
	}
	return dist{N: len(s), P50: q(0.50), P95: q(0.95), P99: q(0.99), P999: q(0.999), Max: s[len(s)-1]}
}

// openLoop calls fn at rate per second from start until end, each call in its
// own goroutine, so a slow system makes latencies grow (they are measured from
// the scheduled time) instead of slowing the schedule down. At most maxInFlight
// calls run at once; a call beyond that is reported to overflow. It returns
// when every call has finished.
func openLoop(ctx context.Context, rate float64, start, end time.Time, maxInFlight int, fn func(sched time.Time), overflow func(sched time.Time)) {
	if rate <= 0 {
		return
	}
	var wg sync.WaitGroup
	var inflight atomic.Int64
	interval := time.Duration(float64(time.Second) / rate)
	for i := 0; ; i++ {
		t := start.Add(time.Duration(i) * interval)
		if !t.Before(end) || ctx.Err() != nil {
			break
		}
		if d := time.Until(t); d > 0 {
			time.Sleep(d)
		}
		if inflight.Load() >= int64(maxInFlight) {
			overflow(t)
			continue
		}
		inflight.Add(1)
		wg.Go(func() {
			defer inflight.Add(-1)
			fn(t)
		})
	}
	wg.Wait()
}

// --- processes -------------------------------------------------------------------

// proc reads a process's CPU time and memory from /proc.
type proc struct {
	name string
	pid  int
}

// cpu is the process's user+system CPU seconds so far.
func (p proc) cpu() float64 {
	_, ticks, err := procstat.Read(p.pid)
	if err != nil {
		return 0
	}
	return float64(ticks) / procstat.ClockTicks
}

// mem returns VmRSS and VmHWM (peak RSS) in bytes.
func (p proc) mem() (rss, peak int64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.pid))
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			rss = v * 1024
		case "VmHWM:":
			peak = v * 1024
		}
	}
	return rss, peak
}

// childProcs finds this process's children named etcd and kube-apiserver
// (envtest starts them).
func childProcs() []proc {
	var out []proc
	me := os.Getpid()
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(d, "stat"))
		if err != nil {
			continue
		}
		s := string(b)
		open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || closing < open {
			continue
		}
		comm := s[open+1 : closing]
		f := strings.Fields(s[closing+2:])
		if len(f) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		if ppid == me && (comm == "etcd" || comm == "kube-apiserver") {
			out = append(out, proc{name: comm, pid: pid})
		}
	}
	return out
}

// usage is the CPU seconds each watched process used between two snapshots.
type usage map[string]float64

type procWatch struct {
	procs []proc
}

func (w *procWatch) snap() usage {
	u := usage{}
	for _, p := range w.procs {
		u[p.name] = p.cpu()
	}
	u["bench"] = proc{pid: os.Getpid()}.cpu()
	return u
}

func (u usage) since(before usage) usage {
	d := usage{}
	for k, v := range u {
		d[k] = v - before[k]
	}
	return d
}

// perSecond is u over secs: each process's share of one core.
func (u usage) perSecond(secs float64) usage {
	d := usage{}
	for k, v := range u {
		d[k] = v / secs
	}
	return d
}

// of sums the processes whose names start with one of prefixes.
func (u usage) of(prefixes ...string) float64 {
	var t float64
	for k, v := range u {
		for _, p := range prefixes {
			if strings.HasPrefix(k, p) {
				t += v
				break
			}
		}
	}
	return t
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// String lists the largest rates first.
func (w writeCounts) String() string {
	keys := make([]string, 0, len(w))
	for k := range w {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		switch {
		case w[a] > w[b]:
			return -1
		case w[a] < w[b]:
			return 1
		}
		return strings.Compare(a, b)
	})
	var parts []string
	for i, k := range keys {
		if i == 5 || w[k] < 0.05 {
			break
		}
		parts = append(parts, fmt.Sprintf("%s %.1f", k, w[k]))
	}
	return strings.Join(parts, ", ")
}
