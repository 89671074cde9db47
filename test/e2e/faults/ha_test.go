//go:build faults

package faults

import (
	"fmt"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/kubelock/kubelock/test/e2e/faults/wire"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kubelock/kubelock/test/history"
)

// The HA control plane's scenarios: what production's several apiservers
// behind a load balancer add to the faults above. Each checks I1–I7 and
// linearizability on its own locks.
var _ = Describe("HA control plane", Ordered, func() {
	var ha *haPlane

	BeforeAll(func(ctx SpecContext) {
		var err error
		ha, err = startHA(ctx, filepath.Join(workDir, "ha"))
		Expect(err).NotTo(HaveOccurred())
		ha.waitServing(ctx)
	}, NodeTimeout(10*time.Minute))

	AfterAll(func() {
		if ha != nil {
			ha.stop()
		}
	})

	It("1: an apiserver SIGSTOPped past a lease with clients and the operator's watch on it: they fail over, nothing expires early, expiry goes on", func(ctx SpecContext) {
		keys := []string{ha.newLock(ctx, "ha1", 3, 2), ha.newLock(ctx, "ha1", 3, 2), ha.newLock(ctx, "ha1", 3, 2)}
		crashed := ha.newLock(ctx, "ha1", 3, 2)
		x := ha.newClient("ha1-x")
		rx := acquireOK(x, crashed, 10*time.Second)
		cs := ha.loopClients("ha1", 4, keys)
		// The apiserver the leader's watch is on, and the clients on it.
		leader := ha.waitLeader()
		target := ha.busiest(leader)
		on := ha.clientsOn(target, cs)
		Expect(on).NotTo(BeEmpty(), "no client on %s, the leader's", target)
		Eventually(func() int { return countOK(events("ha1")) }).Should(BeNumerically(">=", 10))
		a := ha.apiserver(target)
		run := a.Running() // this run: by the cleanup, AfterAll may have stopped it
		killClient(x)      // its lease now waits for the operator, whose watch is on the stopped apiserver
		stoppedAt := history.Mono()
		Expect(run.Signal(syscall.SIGSTOP)).To(Succeed())
		DeferCleanup(func() { _ = run.Signal(syscall.SIGCONT) })
		// Stopped for a scheduled 8 s: more than two leases.
		time.Sleep(8 * time.Second)
		Expect(run.Signal(syscall.SIGCONT)).To(Succeed())
		resumedAt := history.Mono()
		ha.waitBack(ctx, a)
		failover := firstOKOf(on, "ha1", stoppedAt)
		Expect(failover).To(BeNumerically(">", 0), "the stopped apiserver's clients never acquired again")
		Expect(failover).To(BeNumerically("<", resumedAt), "the stopped apiserver's clients acquired again only once it resumed: they did not fail over")
		// The crashed holder's lease expires, never before its safe deadline:
		// no read that returned before it saw the holding ended, and a read
		// sent at or after it still saw it held (the observer reads through
		// each apiserver too, so the stopped one does not blind it).
		Eventually(func() map[string][2]int64 { return ha.obs.expiries("ha1") }).WithTimeout(time.Minute).Should(HaveKey(rx.Lease))
		e := ha.obs.expiries("ha1")[rx.Lease]
		d := lastDeadline(x, rx.Lease)
		Expect(e[0]).To(BeNumerically(">=", d), "the crashed holder's lease was seen expired before its safe deadline")
		Expect(e[1]).To(BeNumerically(">=", d), "no read sent at or after the crashed holder's safe deadline saw it still held (last seen held %s before it)", secs(d-e[1]))
		base := countOKAfter(events("ha1"), resumedAt)
		Eventually(func() int { return countOKAfter(events("ha1"), resumedAt) }).Should(BeNumerically(">=", base+5))
		stopClients(cs)
		ha.unwatch(append(keys, crashed)...)
		check(ctx, result{Scenario: "HA 1 apiserver SIGSTOPped past a lease", Faults: fmt.Sprintf("SIGSTOP of %s for %s (leases 3s) with the leader replica's watch and %d of 4 looping clients (%v) on it; a crashed holder awaiting expiry", target, secs(resumedAt-stoppedAt), len(on), names(on)),
			Recovery: fmt.Sprintf("its clients acquired again %s after the stop, through the other apiserver", secs(failover-stoppedAt)),
			Notes:    fmt.Sprintf("the crashed holder's lease seen expired %s after the stop and %s after its safe deadline, last seen held %s after it", secs(e[0]-stoppedAt), secs(e[0]-d), secs(e[1]-d))}, "ha1")
	})

	It("2: an apiserver SIGKILLed under load: its clients fail over to the other and service goes on", func(ctx SpecContext) {
		keys := []string{ha.newLock(ctx, "ha2", 3, 2), ha.newLock(ctx, "ha2", 3, 2), ha.newLock(ctx, "ha2", 3, 2)}
		cs := ha.loopClients("ha2", 4, keys)
		Eventually(func() int { return countOK(events("ha2")) }).Should(BeNumerically(">=", 10))
		target := ha.busiest(cs[0].process)
		on := ha.clientsOn(target, cs)
		a := ha.apiserver(target)
		killedAt := history.Mono()
		a.Kill()
		var failover int64
		Eventually(func() int64 { failover = firstOKOf(on, "ha2", killedAt); return failover }).WithTimeout(time.Minute).ShouldNot(BeZero())
		Eventually(func() int { return countOKAfter(events("ha2"), killedAt) }).WithTimeout(time.Minute).Should(BeNumerically(">=", 10))
		downFor := history.Mono() - killedAt
		Expect(a.Start(ctx)).To(Succeed())
		ha.waitBack(ctx, a)
		stopClients(cs)
		ha.unwatch(keys...)
		check(ctx, result{Scenario: "HA 2 apiserver killed under load", Faults: fmt.Sprintf("SIGKILL of %s with %d of 4 looping clients (%v) on it, restarted %s later", target, len(on), names(on), secs(downFor)),
			Recovery: fmt.Sprintf("its clients acquired again %s after the kill, through the other apiserver", secs(failover-killedAt))}, "ha2")
	})

	It("3: a client writing to one apiserver while it reads and watches a lagging one: acquires from a stale object meet a conflict, never a wrong holding", func(ctx SpecContext) {
		// A longer lag starves the lagging apiserver's cache under load: what
		// etcd sends it is bound by its HTTP/2 window per round trip.
		const lag = 300 * time.Millisecond
		ha.setLag(lag)
		DeferCleanup(func() { ha.setLag(0) })
		measured := ha.watchLag(ctx, "ha3-lag")
		Expect(measured).To(BeNumerically(">=", lag/2), "the lagging apiserver's watch did not lag")
		user := ha.userConfig(clientUser)
		fresh, stale := ha.APIServers[1-laggingAPIServer].URL, ha.APIServers[laggingAPIServer].URL
		split := newSplitProxy(at(user, stale), at(user, fresh))
		direct := newSplitProxy(at(user, fresh), at(user, fresh))
		DeferCleanup(split.close)
		DeferCleanup(direct.close)
		s0, s1 := newClientVia("ha3-split0", "--server="+split.url()), newClientVia("ha3-split1", "--server="+split.url())
		d := newClientVia("ha3-direct", "--server="+direct.url())

		// Hand-offs: the direct client takes and releases the lock through the
		// up-to-date apiserver, and the split client tries it right after. Every
		// other round the split client first sees it held (its try is refused),
		// so that what it saw last says held when the lock is free: it must read
		// again rather than answer from it. In the other rounds what it saw last
		// is its own release, older than the direct client's writes: its write
		// from it must be refused, and the lock won after.
		probe := ha.newLock(ctx, "ha3", 3, 2)
		const handoffs = 10
		conflicts0 := split.conflicts.Load()
		for i := range handoffs {
			acquireOK(d, probe, 10*time.Second)
			if i%2 == 1 {
				r := s0.do(wire.Command{Cmd: "acquire", Key: probe, Try: true, Wait: 10 * time.Second})
				Expect(r.Outcome).To(Equal(history.Locked), "the split client's try of the held lock: %s", r.Err)
			}
			Expect(d.do(wire.Command{Cmd: "release", Key: probe}).Outcome).To(Equal(history.OK))
			r := s0.do(wire.Command{Cmd: "acquire", Key: probe, Try: true, Wait: 10 * time.Second})
			Expect(r.Outcome).To(Equal(history.OK), "the split client's try of the free lock: %s", r.Err)
			Expect(s0.do(wire.Command{Cmd: "release", Key: probe}).Outcome).To(Equal(history.OK))
		}
		handoffConflicts := split.conflicts.Load() - conflicts0
		Expect(handoffConflicts).To(BeNumerically(">=", 1), "no split write started from a stale object")

		// Contention: the split clients loop with two clients of the up-to-date
		// apiserver, who hold each lock for 200 ms or more. The split clients'
		// acquires wait longer: each of their reads waits for the lagging cache.
		keys := []string{ha.newLock(ctx, "ha3", 3, 2), ha.newLock(ctx, "ha3", 3, 2)}
		cs := []*lockClient{newClientVia("ha3-c0", "--server="+direct.url()), newClientVia("ha3-c1", "--server="+direct.url())}
		splits := []*lockClient{s0, s1}
		loop(cs, keys, 5*time.Second, 100*time.Millisecond)
		loop(splits, keys, 30*time.Second, 0)
		loopFrom := history.Mono()
		Eventually(func(g Gomega) {
			g.Expect(countOKAfter(eventsOf(splits, "ha3"), loopFrom)).To(BeNumerically(">=", 6))
			g.Expect(split.conflicts.Load() - conflicts0 - handoffConflicts).To(BeNumerically(">=", 2))
		}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
		splitOK := countOKAfter(eventsOf(splits, "ha3"), loopFrom)
		underLoad := ha.watchLag(ctx, "ha3-lag-under-load")
		stopClients(append(cs, splits...))
		d.exit()
		splitTimeouts := countOutcome(eventsOf(splits, "ha3"), history.Timeout)
		ha.setLag(0)
		ha.unwatch(append(keys, probe)...)
		check(ctx, result{Scenario: "HA 3 writes to one apiserver, reads and watch from a lagging one", Faults: fmt.Sprintf("the lagging apiserver's etcd responses delayed %s (its watch measured %s behind the other's, %s under the load); 2 clients writing through the up-to-date one and reading and watching through the lagging one, 2 others only through the up-to-date one", lag, measured.Round(10*time.Millisecond), underLoad.Round(10*time.Millisecond)),
			Recovery: "none needed",
			Notes: fmt.Sprintf("%d hand-offs (half of them after the split client saw the lock held): its try right after the other's release won the free lock every time, %d of its writes refused for a stale resourceVersion (409); under contention %d acquisitions by the split clients (%d timed out waiting), %d of their %d writes refused with 409",
				handoffs, handoffConflicts, splitOK, splitTimeouts, split.conflicts.Load()-conflicts0-handoffConflicts, split.writes.Load())}, "ha3")
	})

	It("4: etcd compacted and defragmented during load", func(ctx SpecContext) {
		keys := []string{ha.newLock(ctx, "ha4", 3, 2), ha.newLock(ctx, "ha4", 3, 2), ha.newLock(ctx, "ha4", 3, 2), ha.newLock(ctx, "ha4", 3, 2)}
		cs := ha.loopClients("ha4", 6, keys)
		Eventually(func() int { return countOK(events("ha4")) }).Should(BeNumerically(">=", 10))
		etcd, err := clientv3.New(clientv3.Config{Endpoints: ha.Etcd.Endpoints(), DialTimeout: 10 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		defer func() { _ = etcd.Close() }()
		const window = 30 * time.Second
		from := history.Mono()
		var compactions, defrags int
		var slowest time.Duration
		for end := time.Now().Add(window); time.Now().Before(end); {
			rev, err := etcd.Get(ctx, "compact-probe")
			Expect(err).NotTo(HaveOccurred())
			_, err = etcd.Compact(ctx, rev.Header.Revision, clientv3.WithCompactPhysical())
			Expect(err).NotTo(HaveOccurred())
			compactions++
			for _, ep := range ha.Etcd.Endpoints() {
				start := time.Now()
				_, err := etcd.Defragment(ctx, ep)
				Expect(err).NotTo(HaveOccurred())
				slowest = max(slowest, time.Since(start))
				defrags++
			}
			time.Sleep(3 * time.Second) // scheduled: the next round
		}
		to := history.Mono()
		// One reading of the history for both counts: the clients go on
		// acquiring while it is read, and a second, later reading counted
		// those as after the window and took them off the window's count
		// (-29 once, on a loaded machine).
		evs := events("ha4")
		during := countOKAfter(evs, from) - countOKAfter(evs, to)
		Expect(during).To(BeNumerically(">=", 10), "acquisitions during the compactions")
		p50, p99 := acquireLatency(evs, from, to)
		stopClients(cs)
		ha.unwatch(keys...)
		check(ctx, result{Scenario: "HA 4 etcd compaction and defragmentation under load", Faults: fmt.Sprintf("%d compactions to the current revision and %d defragmentations (one member at a time, the slowest %s) in %s, 6 looping clients on 4 locks", compactions, defrags, slowest.Round(time.Millisecond), window),
			Recovery: "none needed",
			Notes:    fmt.Sprintf("%d acquisitions during the window, acquire p50 %s / p99 %s (contended: waits included)", during, p50, p99)}, "ha4")
	})
})

// countOutcome counts the acquires of evs that returned outcome.
func countOutcome(evs []history.Event, outcome string) int {
	n := 0
	for _, e := range evs {
		if e.Op == history.OpAcquire && e.Phase == history.Return && e.Outcome == outcome {
			n++
		}
	}
	return n
}

// eventsOf are the events of cs about keys with prefix.
func eventsOf(cs []*lockClient, prefix string) []history.Event {
	var evs []history.Event
	for _, e := range events(prefix) {
		if slices.ContainsFunc(cs, func(c *lockClient) bool { return c.name == e.Proc }) {
			evs = append(evs, e)
		}
	}
	return evs
}

// acquireLatency is the median and 99th percentile of the successful
// acquisitions of evs that returned between from and to.
func acquireLatency(evs []history.Event, from, to int64) (p50, p99 time.Duration) {
	type call struct {
		proc string
		id   int64
	}
	invoked := map[call]int64{}
	var ds []time.Duration
	for _, e := range evs {
		if e.Op != history.OpAcquire {
			continue
		}
		switch k := (call{e.Proc, e.ID}); {
		case e.Phase == history.Invoke:
			invoked[k] = e.T
		case e.Phase == history.Return && e.Outcome == history.OK && e.T > from && e.T <= to && invoked[k] > 0:
			ds = append(ds, time.Duration(e.T-invoked[k]))
		}
	}
	if len(ds) == 0 {
		return 0, 0
	}
	slices.Sort(ds)
	at := func(q float64) time.Duration {
		return ds[min(len(ds)-1, int(q*float64(len(ds))))].Round(time.Millisecond)
	}
	return at(0.5), at(0.99)
}
