package metrics

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestHotLocksCardinality: 10,000 locks with waiters and acquisitions export
// at most N series per metric, the hottest ones, and idle locks are forgotten.
func TestHotLocksCardinality(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Unix(1_700_000_000, 0))
	h := newHotLocks(5, clk)
	const locks = 10000
	for i := range locks {
		name := fmt.Sprintf("lock-%05d", i)
		h.SetWaiters("ns", name, i%100) // lock-00099, -00199, … have 99 waiters
		for range i % 7 {
			h.Acquired("ns", name)
		}
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(h)
	if n := testutil.CollectAndCount(h, "kubelock_controller_hot_lock_waiters"); n != 5 {
		t.Fatalf("hot_lock_waiters series = %d, want 5", n)
	}
	if n := testutil.CollectAndCount(h, "kubelock_controller_hot_lock_acquisitions_total"); n != 5 {
		t.Fatalf("hot_lock_acquisitions_total series = %d, want 5", n)
	}
	want := `
# HELP kubelock_controller_hot_lock_waiters Queued waiters of the locks with the longest queues (at most the top N locks).
# TYPE kubelock_controller_hot_lock_waiters gauge
kubelock_controller_hot_lock_waiters{lock="lock-00099",namespace="ns"} 99
kubelock_controller_hot_lock_waiters{lock="lock-00199",namespace="ns"} 99
kubelock_controller_hot_lock_waiters{lock="lock-00299",namespace="ns"} 99
kubelock_controller_hot_lock_waiters{lock="lock-00399",namespace="ns"} 99
kubelock_controller_hot_lock_waiters{lock="lock-00499",namespace="ns"} 99
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kubelock_controller_hot_lock_waiters"); err != nil {
		t.Fatal(err)
	}
	// Locks with i%7 == 6 have 6 acquisitions; the first five by name win ties.
	want = `
# HELP kubelock_controller_hot_lock_acquisitions_total Acquisitions observed of the locks acquired most often over the last one to two minutes (at most the top N locks), counted since the controller started tracking the lock.
# TYPE kubelock_controller_hot_lock_acquisitions_total counter
kubelock_controller_hot_lock_acquisitions_total{lock="lock-00006",namespace="ns"} 6
kubelock_controller_hot_lock_acquisitions_total{lock="lock-00013",namespace="ns"} 6
kubelock_controller_hot_lock_acquisitions_total{lock="lock-00020",namespace="ns"} 6
kubelock_controller_hot_lock_acquisitions_total{lock="lock-00027",namespace="ns"} 6
kubelock_controller_hot_lock_acquisitions_total{lock="lock-00034",namespace="ns"} 6
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kubelock_controller_hot_lock_acquisitions_total"); err != nil {
		t.Fatal(err)
	}

	// Two windows later the acquisitions are no longer recent: only locks
	// with waiters stay tracked, and the acquisition series are gone.
	clk.SetTime(clk.Now().Add(2 * HotWindow))
	if n := testutil.CollectAndCount(h, "kubelock_controller_hot_lock_acquisitions_total"); n != 0 {
		t.Fatalf("hot_lock_acquisitions_total series after two windows = %d, want 0", n)
	}
	if got, want := len(h.locks), locks-locks/100; got != want {
		t.Fatalf("tracked locks = %d, want %d (those with waiters)", got, want)
	}
	for i := range locks {
		h.SetWaiters("ns", fmt.Sprintf("lock-%05d", i), 0)
	}
	testutil.CollectAndCount(h)
	if got := len(h.locks); got != 0 {
		t.Fatalf("tracked locks after queues emptied = %d, want 0", got)
	}
}

// TestHotLocksRecentBeatsOld: a lock acquired often long ago ranks below one
// acquired a little just now.
func TestHotLocksRecentBeatsOld(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Unix(1_700_000_000, 0))
	h := newHotLocks(1, clk)
	for range 100 {
		h.Acquired("ns", "old")
	}
	clk.SetTime(clk.Now().Add(HotWindow))
	for range 3 {
		h.Acquired("ns", "new")
	}
	// "old" still has 100 in the previous window: it is hotter.
	if err := testutil.CollectAndCompare(h, strings.NewReader(`
# HELP kubelock_controller_hot_lock_acquisitions_total Acquisitions observed of the locks acquired most often over the last one to two minutes (at most the top N locks), counted since the controller started tracking the lock.
# TYPE kubelock_controller_hot_lock_acquisitions_total counter
kubelock_controller_hot_lock_acquisitions_total{lock="old",namespace="ns"} 100
`)); err != nil {
		t.Fatal(err)
	}
	clk.SetTime(clk.Now().Add(HotWindow))
	h.Acquired("ns", "new")
	if err := testutil.CollectAndCompare(h, strings.NewReader(`
# HELP kubelock_controller_hot_lock_acquisitions_total Acquisitions observed of the locks acquired most often over the last one to two minutes (at most the top N locks), counted since the controller started tracking the lock.
# TYPE kubelock_controller_hot_lock_acquisitions_total counter
kubelock_controller_hot_lock_acquisitions_total{lock="new",namespace="ns"} 4
`)); err != nil {
		t.Fatal(err)
	}
}

// TestHotLocksStaleTokens: stale-token denials are ranked like acquisitions,
// and a forgotten (deleted) lock loses its series.
func TestHotLocksStaleTokens(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Unix(1_700_000_000, 0))
	h := newHotLocks(2, clk)
	for i, n := range []int{3, 1, 5} {
		for range n {
			h.StaleToken("ns", fmt.Sprintf("db-%d", i))
		}
	}
	h.Acquired("ns", "db-1") // its own ranking
	const help = `
# HELP kubelock_webhook_stale_token_rejections_total Writes of objects fenced by a lock that were denied for a stale or unissued fencing token, of the existing locks with the most such denials over the last one to two minutes (at most the top N locks), counted since this replica started tracking the lock.
# TYPE kubelock_webhook_stale_token_rejections_total counter
`
	if err := testutil.CollectAndCompare(h, strings.NewReader(help+`kubelock_webhook_stale_token_rejections_total{lock="db-0",namespace="ns"} 3
kubelock_webhook_stale_token_rejections_total{lock="db-2",namespace="ns"} 5
`), "kubelock_webhook_stale_token_rejections_total"); err != nil {
		t.Fatal(err)
	}
	h.Forget("ns", "db-2")
	if err := testutil.CollectAndCompare(h, strings.NewReader(help+`kubelock_webhook_stale_token_rejections_total{lock="db-0",namespace="ns"} 3
kubelock_webhook_stale_token_rejections_total{lock="db-1",namespace="ns"} 1
`), "kubelock_webhook_stale_token_rejections_total"); err != nil {
		t.Fatal(err)
	}
}

// TestHotLocksBoundedWithoutScrapes: where nobody scrapes (a replica's
// webhook), a stream of locks each used once keeps the tracker within twice
// the locks active in the last two windows (and minPrune).
func TestHotLocksBoundedWithoutScrapes(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Unix(1_700_000_000, 0))
	h := newHotLocks(DefaultHotLocks, clk)
	const perWindow = 3000
	for w := range 20 {
		for i := range perWindow {
			h.StaleToken("ns", fmt.Sprintf("lock-%d-%d", w, i))
			h.Acquired("ns", fmt.Sprintf("other-%d-%d", w, i))
		}
		clk.SetTime(clk.Now().Add(HotWindow))
	}
	if n, bound := len(h.locks), 2*(2*2*perWindow); n > bound {
		t.Fatalf("tracked locks = %d after 20 windows of %d new locks each, want at most %d", n, 2*perWindow, bound)
	}
}
