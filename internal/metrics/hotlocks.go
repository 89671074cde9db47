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

// minPrune is how many locks the tracker holds before a new one makes it
// prune the idle ones (see track).
const minPrune = 1024

// HotLocks exports per-lock series for the hottest locks only: at most n by
// queued waiters, at most n by recent acquisitions and at most n by recent
// fenced writes denied for a stale token, however many locks exist. It
// remembers only locks with waiters or recent events: the rest are pruned at
// each scrape, and when the tracker has doubled since it last pruned, so that
// it stays bounded where nobody scrapes. A deleted lock is forgotten (Forget).
// It is a prometheus.Collector and safe for concurrent use.
type HotLocks struct {
	n     int
	clock clock.PassiveClock

	waitersDesc      *prometheus.Desc
	acquisitionsDesc *prometheus.Desc
	staleTokensDesc  *prometheus.Desc

	mu    sync.Mutex
	locks map[lockKey]*hotLock
	// pruneAt is the number of tracked locks at which track prunes.
	pruneAt int
}

type lockKey struct{ namespace, name string }

type hotLock struct {
	waiters                   int
	acquisitions, staleTokens recent
}

// recent counts events of one kind on one lock.
type recent struct {
	// total counts them since the lock was first tracked.
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
		staleTokensDesc: prometheus.NewDesc(prometheus.BuildFQName(Namespace, WebhookSubsystem, "stale_token_rejections_total"),
			"Writes of objects fenced by a lock that were denied for a stale or unissued fencing token, of the existing locks with the most such denials over the last one to two minutes (at most the top N locks), counted since this replica started tracking the lock.",
			[]string{"namespace", "lock"}, nil),
		locks:   map[lockKey]*hotLock{},
		pruneAt: minPrune,
	}
}

func (h *HotLocks) epoch() int64 { return h.clock.Now().UnixNano() / int64(HotWindow) }

// SetWaiters records the queue length of a lock.
func (h *HotLocks) SetWaiters(namespace, name string, n int) {
	e := h.epoch()
	h.mu.Lock()
	defer h.mu.Unlock()
	k := lockKey{namespace, name}
	if h.locks[k] == nil && n == 0 {
		return
	}
	h.track(k, e).waiters = n
}

// Acquired records an acquisition of a lock.
func (h *HotLocks) Acquired(namespace, name string) {
	h.update(namespace, name, func(l *hotLock, e int64) { l.acquisitions.add(e) })
}

// StaleToken records a fenced write denied for a stale or unissued token of
// a lock the caller read: name must be an existing lock's, never a name the
// write merely carried, so that every series is a lock's.
func (h *HotLocks) StaleToken(namespace, name string) {
	h.update(namespace, name, func(l *hotLock, e int64) { l.staleTokens.add(e) })
}

// update applies f to the record of a lock, tracking it, in the current window.
func (h *HotLocks) update(namespace, name string, f func(l *hotLock, e int64)) {
	e := h.epoch()
	h.mu.Lock()
	defer h.mu.Unlock()
	f(h.track(lockKey{namespace, name}, e), e)
}

// track returns the record of k, adding it if needed. Adding to a tracker
// that doubled since it last pruned prunes the idle locks first: its size
// stays within twice the active locks (and minPrune) without a scrape.
// h.mu is held.
func (h *HotLocks) track(k lockKey, e int64) *hotLock {
	if l := h.locks[k]; l != nil {
		return l
	}
	if len(h.locks) >= h.pruneAt {
		h.prune(e)
		h.pruneAt = max(minPrune, 2*len(h.locks))
	}
	l := &hotLock{}
	h.locks[k] = l
	return l
}

// prune forgets the locks with neither waiters nor recent events. h.mu is held.
func (h *HotLocks) prune(e int64) {
	for k, l := range h.locks {
		if l.idle(e) {
			delete(h.locks, k)
		}
	}
}

// Forget drops a deleted lock.
func (h *HotLocks) Forget(namespace, name string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.locks, lockKey{namespace, name})
}

func (l *hotLock) idle(e int64) bool {
	return l.waiters == 0 && l.acquisitions.heat(e) == 0 && l.staleTokens.heat(e) == 0
}

// add counts one event in window e.
func (r *recent) add(e int64) {
	switch r.epoch {
	case e:
	case e - 1:
		r.prev, r.cur = r.cur, 0
	default:
		r.prev, r.cur = 0, 0
	}
	r.epoch = e
	r.cur++
	r.total++
}

// heat is the events in the current and the previous window.
func (r *recent) heat(e int64) uint64 {
	switch r.epoch {
	case e:
		return r.cur + r.prev
	case e - 1:
		return r.cur
	}
	return 0
}

// Describe implements prometheus.Collector.
func (h *HotLocks) Describe(ch chan<- *prometheus.Desc) {
	ch <- h.waitersDesc
	ch <- h.acquisitionsDesc
	ch <- h.staleTokensDesc
}

// Collect implements prometheus.Collector: the top n locks by waiters, by
// recent acquisitions and by recent stale tokens, ties broken by name so that
// scrapes are stable. Idle locks are forgotten here.
func (h *HotLocks) Collect(ch chan<- prometheus.Metric) {
	e := h.epoch()
	var byWaiters, byAcquisitions, byStaleTokens []ranked
	h.mu.Lock()
	h.prune(e)
	for k, l := range h.locks {
		if l.waiters > 0 {
			byWaiters = append(byWaiters, ranked{k, uint64(l.waiters), float64(l.waiters)})
		}
		byAcquisitions = l.acquisitions.rank(byAcquisitions, k, e)
		byStaleTokens = l.staleTokens.rank(byStaleTokens, k, e)
	}
	h.mu.Unlock()
	h.emit(ch, h.waitersDesc, prometheus.GaugeValue, byWaiters)
	h.emit(ch, h.acquisitionsDesc, prometheus.CounterValue, byAcquisitions)
	h.emit(ch, h.staleTokensDesc, prometheus.CounterValue, byStaleTokens)
}

// rank appends k, ranked by its heat and reporting its total, when it has heat.
func (r *recent) rank(items []ranked, k lockKey, e int64) []ranked {
	if heat := r.heat(e); heat > 0 {
		return append(items, ranked{k, heat, float64(r.total)})
	}
	return items
}

// emit sends the top n items as series of d.
func (h *HotLocks) emit(ch chan<- prometheus.Metric, d *prometheus.Desc, t prometheus.ValueType, items []ranked) {
	for _, it := range top(items, h.n) {
		ch <- prometheus.MustNewConstMetric(d, t, it.value, it.key.namespace, it.key.name)
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
