package metrics

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"
)

// DefaultHotLocks is how many locks each hot-lock metric reports at most.
const DefaultHotLocks = 10

// HotWindow is the window over which acquisitions count as recent: a lock's
// heat is its acquisitions in the current and the previous window.
const HotWindow = time.Minute

// HotLocks exports per-lock series for the hottest locks only: at most n by
// queued waiters and at most n by recent acquisitions, however many locks
// exist. It remembers only locks with waiters or recent acquisitions; the rest
// are pruned at each scrape. It is a prometheus.Collector and safe for
// concurrent use.
type HotLocks struct {
	n     int
	clock clock.PassiveClock

	waitersDesc      *prometheus.Desc
	acquisitionsDesc *prometheus.Desc

	mu    sync.Mutex
	locks map[lockKey]*hotLock
}

type lockKey struct{ namespace, name string }

type hotLock struct {
	waiters int
	// total counts acquisitions since the lock was first tracked.
	total uint64
	// epoch is the window number of cur; prev is the window before it.
	epoch     int64
	cur, prev uint64
}

// newHotLocks returns a tracker that reports the n hottest locks, measuring
// windows on clk.
func newHotLocks(n int, clk clock.PassiveClock) *HotLocks {
	return &HotLocks{
		n:     max(n, 0),
		clock: clk,
		waitersDesc: prometheus.NewDesc(prometheus.BuildFQName(Namespace, ControllerSubsystem, "hot_lock_waiters"),
			"Queued waiters of the locks with the longest queues (at most the top N locks).",
			[]string{"namespace", "lock"}, nil),
		acquisitionsDesc: prometheus.NewDesc(prometheus.BuildFQName(Namespace, ControllerSubsystem, "hot_lock_acquisitions_total"),
			"Acquisitions observed of the locks acquired most often over the last one to two minutes (at most the top N locks), counted since the controller started tracking the lock.",
			[]string{"namespace", "lock"}, nil),
		locks: map[lockKey]*hotLock{},
	}
}

func (h *HotLocks) epoch() int64 { return h.clock.Now().UnixNano() / int64(HotWindow) }

// SetWaiters records the queue length of a lock.
func (h *HotLocks) SetWaiters(namespace, name string, n int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	k := lockKey{namespace, name}
	l := h.locks[k]
	if l == nil {
		if n == 0 {
			return
		}
		l = &hotLock{}
		h.locks[k] = l
	}
	l.waiters = n
}

// Acquired records an acquisition of a lock.
func (h *HotLocks) Acquired(namespace, name string) {
	e := h.epoch()
	h.mu.Lock()
	defer h.mu.Unlock()
	k := lockKey{namespace, name}
	l := h.locks[k]
	if l == nil {
		l = &hotLock{epoch: e}
		h.locks[k] = l
	}
	switch l.epoch {
	case e:
	case e - 1:
		l.prev, l.cur = l.cur, 0
	default:
		l.prev, l.cur = 0, 0
	}
	l.epoch = e
	l.cur++
	l.total++
}

// Forget drops a deleted lock.
func (h *HotLocks) Forget(namespace, name string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.locks, lockKey{namespace, name})
}

// heat is the lock's acquisitions in the current and the previous window.
func (l *hotLock) heat(e int64) uint64 {
	switch l.epoch {
	case e:
		return l.cur + l.prev
	case e - 1:
		return l.cur
	}
	return 0
}

// Describe implements prometheus.Collector.
func (h *HotLocks) Describe(ch chan<- *prometheus.Desc) {
	ch <- h.waitersDesc
	ch <- h.acquisitionsDesc
}

// Collect implements prometheus.Collector: the top n locks by waiters and by
// heat, ties broken by name so that scrapes are stable. Locks with neither
// waiters nor heat are forgotten here.
func (h *HotLocks) Collect(ch chan<- prometheus.Metric) {
	e := h.epoch()
	var byWaiters, byHeat []ranked
	h.mu.Lock()
	for k, l := range h.locks {
		heat := l.heat(e)
		if l.waiters == 0 && heat == 0 {
			delete(h.locks, k)
			continue
		}
		if l.waiters > 0 {
			byWaiters = append(byWaiters, ranked{k, uint64(l.waiters), float64(l.waiters)})
		}
		if heat > 0 {
			byHeat = append(byHeat, ranked{k, heat, float64(l.total)})
		}
	}
	h.mu.Unlock()
	for _, it := range top(byWaiters, h.n) {
		ch <- prometheus.MustNewConstMetric(h.waitersDesc, prometheus.GaugeValue, it.value, it.key.namespace, it.key.name)
	}
	for _, it := range top(byHeat, h.n) {
		ch <- prometheus.MustNewConstMetric(h.acquisitionsDesc, prometheus.CounterValue, it.value, it.key.namespace, it.key.name)
	}
}

// ranked is a lock's score in one ranking and the value it reports.
type ranked struct {
	key   lockKey
	score uint64
	value float64
}

// top is the n items of highest score, ties broken by namespace and name.
func top(items []ranked, n int) []ranked {
	slices.SortFunc(items, func(a, b ranked) int {
		return cmp.Or(cmp.Compare(b.score, a.score), cmp.Compare(a.key.namespace, b.key.namespace), cmp.Compare(a.key.name, b.key.name))
	})
	return items[:min(n, len(items))]
}
