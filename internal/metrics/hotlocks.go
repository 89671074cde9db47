package metrics

import (
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
	byWaiters := topN[lockKey]{n: h.n}
	byHeat := topN[lockKey]{n: h.n}
	h.mu.Lock()
	for k, l := range h.locks {
		heat := l.heat(e)
		if l.waiters == 0 && heat == 0 {
			delete(h.locks, k)
			continue
		}
		if l.waiters > 0 {
			byWaiters.offer(k, uint64(l.waiters), float64(l.waiters), less(k))
		}
		if heat > 0 {
			byHeat.offer(k, heat, float64(l.total), less(k))
		}
	}
	h.mu.Unlock()
	for _, it := range byWaiters.items {
		ch <- prometheus.MustNewConstMetric(h.waitersDesc, prometheus.GaugeValue, it.value, it.key.namespace, it.key.name)
	}
	for _, it := range byHeat.items {
		ch <- prometheus.MustNewConstMetric(h.acquisitionsDesc, prometheus.CounterValue, it.value, it.key.namespace, it.key.name)
	}
}

func less(k lockKey) func(lockKey) bool {
	return func(o lockKey) bool {
		if k.namespace != o.namespace {
			return k.namespace < o.namespace
		}
		return k.name < o.name
	}
}

// topN keeps the n items of highest score, sorted best first; n is small, so
// insertion into a short sorted slice beats a heap.
type topN[K any] struct {
	n     int
	items []ranked[K]
}

type ranked[K any] struct {
	key   K
	score uint64
	value float64
}

// offer considers key with score; keyLess tells whether key sorts before
// another key, to break ties.
func (t *topN[K]) offer(key K, score uint64, value float64, keyLess func(K) bool) {
	if t.n == 0 {
		return
	}
	better := func(o ranked[K]) bool { return score > o.score || (score == o.score && keyLess(o.key)) }
	if len(t.items) == t.n && !better(t.items[len(t.items)-1]) {
		return
	}
	i := len(t.items)
	for i > 0 && better(t.items[i-1]) {
		i--
	}
	t.items = append(t.items, ranked[K]{})
	copy(t.items[i+1:], t.items[i:])
	t.items[i] = ranked[K]{key: key, score: score, value: value}
	if len(t.items) > t.n {
		t.items = t.items[:t.n]
	}
}
