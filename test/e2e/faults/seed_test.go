//go:build faults

package faults

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/kubelock/kubelock/internal/localcluster"
	"github.com/kubelock/kubelock/test/e2e/faults/wire"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubelock/kubelock/test/history"
)

// The seed's acceptance test: the seed mix at 70 % of the rate kubelock
// sustains on this machine with and without the fault's replicas, measured
// in the same run, with the seed's lease of 30 s renewed every 10 s, before,
// during and after a fault; the uncontended acquire's p99 stays within
// 200 ms in every phase and every history check passes. It is labelled
// seed-acceptance (the HA control plane's run ha-plane too, the lock
// apiserver backend's lock-apiserver): the suite's race-detector run leaves
// it out, which would time the detector rather than the locks; `make
// test-faults` then runs every spec but the HA plane's, reporting the
// latency bound rather than asserting it (seedBoundAsserted), and `make
// test-seed` all three, asserting it.
var _ = Describe("the seed's acceptance test", Label("seed-acceptance"), func() {
	It("seed acceptance: p99 of an uncontended acquire ≤ 200 ms before, during and after one etcd member down with compaction and defragmentation, at 70 % of capacity", func(ctx SpecContext) {
		kc, err := cp.Kubeconfig("seed-client.kubeconfig", clientUser)
		Expect(err).NotTo(HaveOccurred())
		target := seedTarget{Name: "3 etcd members, 1 kube-apiserver", Admin: admin, Etcd: cp.Etcd, Kubeconfig: kc, Metrics: cp.admin, Observer: obs, Prefix: "seed"}
		seedAcceptance(ctx, target, etcdMemberDown(cp.Etcd, cp.ready), seedDefaults)
	})

	It("seed acceptance behind HAProxy: the same with one of two kube-apiservers down too", Label("ha-plane"), func(ctx SpecContext) {
		ha, err := startHA(ctx, filepath.Join(workDir, "seed-ha"))
		if ha != nil {
			DeferCleanup(ha.stop)
		}
		Expect(err).NotTo(HaveOccurred())
		ha.waitServing(ctx)
		// Metrics: none, each apiserver has its own histograms and one is down.
		target := seedTarget{Name: "3 etcd members, 2 kube-apiservers behind HAProxy", Admin: ha.admin, Etcd: ha.Etcd, Kubeconfig: ha.clientConf, Observer: ha.obs, Prefix: "seed-ha"}
		seedAcceptance(ctx, target, apiserverDownToo(ha, etcdMemberDown(ha.Etcd, ha.ready)), seedDefaults)
	})

	// The backend built for the seed's workload: the seed's consensus group
	// is the lock store's etcd, so its member is the replica down and its
	// keyspace the one compacted and defragmented in the window. Lock
	// requests reach the two kubelock-apiserver replicas through
	// kube-apiserver's aggregation layer, as a client's do by default; no
	// admission webhook is called (the rules run in the lock apiserver).
	It("seed acceptance on kubelock-apiserver: the same with one of its lock store's three members down", Label("lock-apiserver"), func(ctx SpecContext) {
		b := startLockBackend(ctx)
		kc, err := cp.Kubeconfig("seed-lockapi-client.kubeconfig", clientUser)
		Expect(err).NotTo(HaveOccurred())
		target := seedTarget{Name: "the lock apiserver backend (2 kubelock-apiserver replicas on a 3-member lock etcd, behind 1 kube-apiserver)", Admin: admin, Etcd: b.etcd,
			Kubeconfig: kc, Metrics: b.replicas[0].Direct(b.env.Config), Observer: obs, Prefix: "seed-la"}
		seedAcceptance(ctx, target, etcdMemberDown(b.etcd, b.ready), seedDefaults)
	})
})

// apiserverDownToo is fault with the second kube-apiserver stopped as well
// (the first, which fault's restore waits for, stays up): HAProxy sends
// every client to the one left.
func apiserverDownToo(ha *haPlane, fault seedFault) seedFault {
	return seedFault{
		Name: "kube-apiserver 2 of 2 stopped; " + fault.Name,
		Degrade: func(ctx context.Context) ([]*localcluster.Member, func(context.Context) string) {
			a := ha.APIServers[len(ha.APIServers)-1]
			Expect(a.Stop()).To(Succeed())
			up, restore := fault.Degrade(ctx)
			return up, func(ctx context.Context) string {
				notes := restore(ctx)
				how := startOwnMachine(ctx, a.Component)
				ha.waitBack(ctx, a)
				return notes + "; " + a.Name + " restarted " + how + ", back behind HAProxy after it"
			}
		},
	}
}

// seedTarget is the control plane the seed's acceptance test runs against.
type seedTarget struct {
	// Name says what it is, in the report.
	Name string
	// Admin creates the locks.
	Admin client.Client
	// Etcd is its store, compacted before every mix starts.
	Etcd *localcluster.Etcd
	// Kubeconfig is how the client processes reach it as the lock user:
	// straight, not through the fault proxy, as the seed's clients would.
	Kubeconfig string
	// Metrics reads the /metrics of a server the lock writes reach (a
	// kube-apiserver, or one of the lock apiserver's replicas, which serves
	// half of them), to say where the time went.
	Metrics *rest.Config
	// Observer reads one of the run's locks.
	Observer *observer
	// Prefix names the run's locks, client processes and report row.
	Prefix string
}

// seedFault is the state a replica's loss leaves the control plane in.
// Degrade stops what the fault stops and returns the etcd members left up
// (the window's compaction and defragmentation run on them) and the restore,
// which starts the rest again, waits until it serves and says what happened.
// The capacity probes run in that state, and the window (see phases).
type seedFault struct {
	Name    string
	Degrade func(ctx context.Context) (up []*localcluster.Member, restore func(ctx context.Context) string)
}

// seedConfig shapes the run. The lease and its renewal are the seed's; the
// phases are as short as the percentiles allow (see seedDefaults).
type seedConfig struct {
	Clients, Workers  int           // client processes; closed-loop workers per process
	CapWarmup, CapFor time.Duration // the closed-loop estimate's unmeasured and measured time
	ProbeWarmup       time.Duration // each probe's unmeasured start
	ProbeFor          time.Duration // each probe's measured time, after its warm-up
	Share             float64       // of the sustained rate (seedRun.sustained), offered open-loop
	Lease, Hold       time.Duration // the lease (renewed every third of it); the churn's holding time
	Warmup            time.Duration // from the mix's population held to the first phase
	Before, During    time.Duration
	After             time.Duration
	Bound             time.Duration // the uncontended acquire's p99, in every phase
}

// seedDefaults: a 60 s window lets every holding renew (at least) five times
// with the member down, and holds the compaction and both defragmentations
// with room on either side; 40 s before and after give each operation some
// hundreds of samples per phase at the rates this machine sustains, so a
// p99 rests on several samples beyond it.
//
// A probe's warm-up is one renewal interval (every held lock has renewed
// once on its own schedule); it then measures 30 s, not 15: on two cores
// shared by the control plane, its operators and the clients, 15 s probes
// read rates that a phase then did not sustain. A search could end on a
// probe past the knee, and the first 25 s of "before" were then still slow
// after a 10 s warm-up (docs/reliability.md): the mix warms up for a lease,
// so that whatever the probes left behind has been released or expired.
var seedDefaults = seedConfig{
	Clients: 4, Workers: 8, CapWarmup: 3 * time.Second, CapFor: 15 * time.Second,
	ProbeWarmup: 10 * time.Second, ProbeFor: 30 * time.Second, Share: 0.7,
	Lease: 30 * time.Second, Hold: 200 * time.Millisecond, Warmup: 30 * time.Second,
	Before: 40 * time.Second, During: 60 * time.Second, After: 40 * time.Second,
	Bound: 200 * time.Millisecond,
}

// seedAcceptance runs the seed's acceptance test against t with fault in
// the window.
func seedAcceptance(ctx context.Context, t seedTarget, fault seedFault, cfg seedConfig) {
	r := &seedRun{t: t, cfg: cfg, keys: make([][]string, cfg.Clients)}
	r.addKeys(ctx, 2*cfg.Workers) // the capacity step's: two per worker
	for i := range cfg.Clients {
		r.cs = append(r.cs, newClientVia(fmt.Sprintf("%s-c%d", t.Prefix, i), "--kubeconfig="+t.Kubeconfig))
	}
	// The observer reads one lock (ten quorum reads a second: a seed
	// client never reads), so the store's own record is checked too.
	observed := r.keys[0][0]
	t.Observer.watch(observed)

	capacity, degraded := r.sustained(ctx, fault, seedCapacity(r.cs, r.keys, cfg))
	rate := cfg.Share * capacity
	r.startMix(ctx, rate)
	time.Sleep(cfg.Warmup) // the workload's warm-up, not synchronisation
	cpu := startCPUSampler()
	DeferCleanup(func() { cpu.Stop() }) // if the phases fail; a second Stop does nothing
	phases, scrapes, faultNotes := r.phases(ctx, fault)
	cpuSamples := cpu.Stop()
	samples, lost := r.stop()
	t.Observer.unwatch(observed)

	stats := seedStats(phases, samples)
	table := seedTable(stats)
	title := fmt.Sprintf("seed's acceptance test on %s, fault: %s; %s; capacity %.1f lock writes/s (probes of %s; %.1f sustained with the fault's replicas down), offered %.1f (%.0f %%), lease %s renewed every %s",
		t.Name, fault.Name, maintenanceName, capacity, cfg.ProbeFor, degraded, rate, 100*cfg.Share, cfg.Lease, cfg.Lease/3)
	seedLog("\n%s\n%s\nfault: %s\nacquires by 5 s span:\n%s", title, table, faultNotes, seedTimeline(phases, samples, 5*time.Second))
	AddReportEntry(title, table)
	seedLog("where the CPU went (of one core, from /proc; the machine's share of all its cores), by phase and by 5 s span:\n%s", seedCPU(phases, cpuSamples, 5*time.Second))
	if t.Metrics != nil {
		seedLog("where the time went (the server's histograms over each phase, interpolated within their buckets; in brackets how many requests):\n%s", seedBreakdown(stats, scrapes))
	}
	worst := time.Duration(0)
	for _, s := range stats {
		worst = max(worst, s.Ops["acquire"].P99)
	}
	verdict := "met"
	if worst > cfg.Bound {
		verdict = "MISSED"
	}
	check(ctx, result{Scenario: fmt.Sprintf("seed's acceptance test (%s)", t.Name), Faults: fault.Name + "; " + maintenanceName + ": " + faultNotes,
		Recovery: fmt.Sprintf("uncontended acquire p99 %s at worst: bound %s %s", fmtP(worst), cfg.Bound, verdict),
		Notes: fmt.Sprintf("seed mix at %.1f lock writes/s, %.0f %% of the %.1f sustained with and without the fault's replicas; %d holdings lost while renewed",
			rate, 100*cfg.Share, capacity, lost)}, t.Prefix)

	for _, s := range stats {
		for _, op := range seedOps {
			Expect(s.Ops[op].N).To(BeNumerically(">", 0), "no %s in phase %s", op, s.Name)
			Expect(s.Ops[op].Errors).To(BeZero(), "failed %s operations in phase %s:\n%s", op, s.Name, table)
		}
	}
	Expect(lost).To(BeZero(), "holdings of the renewed population lost (renewals slower than the safe deadline allows)")
	if !seedBoundAsserted() {
		seedLog("seed's acceptance test on %s: the bound %s (uncontended acquire p99 %s at worst, bound %s); measured and reported, not asserted (FAULTS_SEED_BOUND=report)",
			t.Name, verdict, fmtP(worst), cfg.Bound)
		return
	}
	for _, s := range stats {
		Expect(s.Ops["acquire"].P99).To(BeNumerically("<=", cfg.Bound), "uncontended acquire p99 in phase %s:\n%s", s.Name, table)
	}
}

// seedBoundAsserted says whether the latency bound fails the spec: it does
// unless FAULTS_SEED_BOUND=report, which `make test-faults` (and so CI) sets.
// Everything else the spec checks (every history check, no failed operation,
// no renewed holding lost) is asserted either way. A latency bound at 70 %
// of the capacity is a performance figure: on CI's two cores, shared by every
// process of the control plane, the operator and the clients on a machine
// whose speed drifts over minutes, the same tree met it and missed it from
// one run to the next (docs/reliability.md), so CI measures and reports it,
// and `make test-seed` on a quiet machine asserts it.
func seedBoundAsserted() bool { return os.Getenv("FAULTS_SEED_BOUND") != "report" }

// seedRun is one run of the seed's acceptance test: its locks, each client
// process's own, and the processes.
type seedRun struct {
	t    seedTarget
	cfg  seedConfig
	keys [][]string
	cs   []*lockClient
}

// addKeys creates locks until every process has perClient.
func (r *seedRun) addKeys(ctx context.Context, perClient int) {
	var fresh []string
	for i := range r.keys {
		for j := len(r.keys[i]); j < perClient; j++ {
			k := fmt.Sprintf("%s-c%d-%d", r.t.Prefix, i, j)
			r.keys[i], fresh = append(r.keys[i], k), append(fresh, k)
		}
	}
	createSeedLocks(ctx, r.t.Admin, fresh, r.cfg.Lease)
}

// startMix offers the seed mix at rate lock writes/s, spread evenly over
// the processes, once each holds its share of the renewed population.
//
// Every mix, each probe's and the measured one, starts on a compacted,
// defragmented store. The capacity step and the probes write minutes of
// history at the machine's limit; kube-apiserver compacts every 5 minutes,
// and its compaction of that history (batch by batch, each holding etcd's
// backend) slowed 25 s of a "before" phase and made probes of one rate
// disagree, whichever it fell into. A production store is compacted every 5
// minutes too; the window's compaction is of the mix's own history.
func (r *seedRun) startMix(ctx context.Context, rate float64) {
	m := compactAndDefragment(ctx, running(r.t.Etcd), history.Mono())
	Expect(m.err).NotTo(HaveOccurred(), "compacting the store before the mix: %s", m)
	seedLog("seed mix: store compacted: %s", m)
	perClient := rate / float64(len(r.cs))
	held := perClient / 3 * (r.cfg.Lease / 3).Seconds()
	// The population, the churn's holdings in flight (more as latencies
	// grow), and keys retired for a while after an operation without a
	// definite outcome.
	r.addKeys(ctx, int(math.Ceil(2*held))+40)
	seedLog("seed mix: offering %.1f lock writes/s, %.0f held locks renewed every %s", rate, float64(len(r.cs))*held, r.cfg.Lease/3)
	eachClient(r.cs, func(i int, c *lockClient) {
		rep := c.do(wire.Command{Cmd: "seed", Keys: r.keys[i], Rate: perClient, Lease: r.cfg.Lease, Hold: r.cfg.Hold})
		Expect(rep.Outcome).To(Equal(history.OK), "%s: %s", c.name, rep.Err)
	})
}

// maintenanceName is the work the window runs besides the fault.
const maintenanceName = "compaction and defragmentation of the members left up inside the window"

// phases runs before, during (with fault, and the store compacted and
// defragmented inside it) and after, each from its start for its length,
// and returns them, the apiserver's metrics at their edges and what the
// fault and the maintenance said. A replica is down until it serves again,
// so "during" lasts until the fault's restore has brought every replica
// back (its restart is in the window, not in "after"), and "after" is the
// control plane whole again.
func (r *seedRun) phases(ctx context.Context, fault seedFault) ([]seedPhase, []serverScrape, string) {
	var phases []seedPhase
	// Read aside, so that a slow read never delays the fault's schedule.
	scrapes := make([]serverScrape, 4)
	var scraping sync.WaitGroup
	// begin opens the phase name (ending the one before) and returns what
	// waits until it has lasted d.
	begin := func(name string, d time.Duration) (wait func()) {
		now := history.Mono()
		if len(phases) > 0 {
			phases[len(phases)-1].To = now
		}
		if r.t.Metrics != nil {
			i := len(phases)
			scraping.Go(func() {
				defer GinkgoRecover()
				scrapes[i] = scrapeServer(ctx, r.t.Metrics)
			})
		}
		if name != "" {
			phases = append(phases, seedPhase{Name: name, From: now})
		}
		return func() { time.Sleep(time.Duration(now + int64(d) - history.Mono())) }
	}
	begin("before", r.cfg.Before)()
	wait := begin("during", r.cfg.During)
	up, restore := fault.Degrade(ctx)
	restore = restoreOnCleanup(restore)
	maintained := maintainInWindow(ctx, up, phases[len(phases)-1].From, r.cfg.During)
	wait()
	notes := maintained()
	notes = restore(ctx) + " (inside the window, at its end); " + notes
	begin("after", r.cfg.After)()
	begin("", 0)
	scraping.Wait()
	return phases, scrapes, notes
}

// stop ends the mix in every process and the processes, and returns the
// samples and how many renewed holdings were lost.
func (r *seedRun) stop() ([]wire.Sample, int) {
	samples, lost := r.stopMix()
	for _, c := range r.cs {
		c.exit()
	}
	return samples, lost
}

// stopMix ends the mix in every process and returns its samples and how
// many renewed holdings were lost; the processes stay for another mix.
func (r *seedRun) stopMix() ([]wire.Sample, int) {
	var samples []wire.Sample
	lost := 0
	var mu sync.Mutex
	eachClient(r.cs, func(_ int, c *lockClient) {
		rep := c.do(wire.Command{Cmd: "seed-stop"})
		Expect(rep.Outcome).To(Equal(history.OK), "%s: %s", c.name, rep.Err)
		mu.Lock()
		samples, lost = append(samples, rep.Samples...), lost+rep.Lost
		mu.Unlock()
	})
	return samples, lost
}

// sustained is the capacity the bound is read against: the highest rate
// the open-loop mix sustains in both states the test puts the control plane
// in, as a replicated service is sized (a rate it sustains only with every
// replica up is not one it can promise through a replica's loss, nor the
// other way round). Read with every replica up only, 70 % of it went over
// the bound in the window (docs/reliability.md, run 5: with a follower
// down, every commit waits for the one left); read with them down only, it
// did before the window on the HA plane, whose two apiservers on two cores
// sustain less than one (run 8). The search runs with the fault's replicas
// down from half the estimate (the closed-loop step's, which takes and drops
// the same lock in turn before any held population exists, and so measures
// more than the mix sustains: offered 70 % of it, the mix fell behind and
// its latency climbed for the whole run), up or down by 15 % until it
// brackets the knee; then, with every replica up, from the rate found down
// until one is sustained. It returns that capacity and the degraded state's.
func (r *seedRun) sustained(ctx context.Context, fault seedFault, estimate float64) (capacity, degraded float64) {
	_, restore := fault.Degrade(ctx)
	restore = restoreOnCleanup(restore)
	degraded = r.search(ctx, "with the fault's replicas down", 0.5*estimate, true)
	seedLog("seed mix: restored after the probes: %s", restore(ctx))
	return r.search(ctx, "with every replica up", degraded, false), degraded
}

// restoreOnCleanup returns restore, also registered to run when the spec
// ends if nothing has called it by then (a failure in between), so that a
// stopped member or apiserver never outlives its spec.
func restoreOnCleanup(restore func(context.Context) string) func(context.Context) string {
	done := false
	DeferCleanup(func(ctx SpecContext) {
		if !done {
			restore(ctx)
		}
	})
	return func(ctx context.Context) string {
		done = true
		return restore(ctx)
	}
}

// search probes the mix from rate, stepping by 15 %: up while probes are
// sustained (when climb), down until one is; a probe sustained below one
// that was not ends the search, so no rate is probed twice. The answer is
// a rate a probe sustained, and no sustained probe fails the spec. Each
// probe offers a rate for its warm-up and ProbeFor more; it is sustained
// when every operation succeeded, their p99 is within the bound and 95 %
// of the offered rate completed (a backlog shows in the p99). When none is,
// the spec fails if it asserts the bound; otherwise (it only reports it)
// the answer is the lowest rate probed, and the report says so.
func (r *seedRun) search(ctx context.Context, state string, rate float64, climb bool) float64 {
	const probes, step = 7, 1.15
	best, failed := 0.0, false
	for range probes {
		ok := r.probe(ctx, state, rate)
		switch {
		case ok && climb && !failed:
			best = rate
			rate *= step
		case ok:
			return rate
		case best > 0:
			return best // the first not sustained above a sustained one
		default:
			failed = true
			rate /= step
		}
	}
	if best > 0 {
		return best
	}
	lowest := rate * step
	if seedBoundAsserted() {
		Fail(fmt.Sprintf("no probe of the seed mix %s was sustained, down to %.1f lock writes/s", state, lowest))
	}
	seedLog("seed mix: no probe %s was sustained within the bound, down to %.1f lock writes/s: the search answers that rate (the bound is reported, not asserted)", state, lowest)
	return lowest
}

// probe offers the mix at rate and says whether it was sustained.
func (r *seedRun) probe(ctx context.Context, state string, rate float64) bool {
	measure := r.cfg.ProbeFor
	r.startMix(ctx, rate)
	from := history.Mono() + int64(r.cfg.ProbeWarmup)
	// The probe's length, and a second for the operations scheduled at its
	// end to finish (stopping the mix cuts those in flight): not
	// synchronisation.
	time.Sleep(r.cfg.ProbeWarmup + measure + time.Second)
	samples, _ := r.stopMix()
	st := seedStats([]seedPhase{{Name: "probe", From: from, To: from + int64(measure)}}, samples)[0]
	worst, errs := time.Duration(0), 0
	for _, op := range seedOps {
		worst, errs = max(worst, st.Ops[op].P99), errs+st.Ops[op].Errors
	}
	ok := errs == 0 && worst <= r.cfg.Bound && st.Achieved >= 0.95*rate
	seedLog("seed mix: probe %s at %.1f lock writes/s: achieved %.1f, p99 %s, %d errors: sustained %v", state, rate, st.Achieved, fmtP(worst), errs, ok)
	return ok
}

// seedCapacity runs the closed-loop step on every process at once and
// returns the lock writes per second they completed together: where the
// search for the sustained rate starts.
func seedCapacity(cs []*lockClient, keys [][]string, cfg seedConfig) float64 {
	var mu sync.Mutex
	var ops int64
	var errs []string
	eachClient(cs, func(i int, c *lockClient) {
		r := c.do(wire.Command{Cmd: "seed-capacity", Keys: keys[i], N: cfg.Workers, Lease: cfg.Lease, Warmup: cfg.CapWarmup, For: cfg.CapFor})
		Expect(r.Outcome).To(Equal(history.OK), "%s: %s", c.name, r.Err)
		mu.Lock()
		ops += r.Ops
		if r.Errors > 0 {
			errs = append(errs, fmt.Sprintf("%s: %d", c.name, r.Errors))
		}
		mu.Unlock()
	})
	if len(errs) > 0 {
		seedLog("capacity step: failed lock writes: %s", strings.Join(errs, ", "))
	}
	Expect(ops).To(BeNumerically(">", 0), "the capacity step completed no lock write")
	capacity := float64(ops) / cfg.CapFor.Seconds()
	seedLog("seed mix: closed-loop estimate %.1f lock writes/s (%d workers, %s)", capacity, len(cs)*cfg.Workers, cfg.CapFor)
	return capacity
}

// eachClient calls f for every process at once and waits.
func eachClient(cs []*lockClient, f func(i int, c *lockClient)) {
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Go(func() {
			defer GinkgoRecover()
			f(i, c)
		})
	}
	wg.Wait()
}

// createSeedLocks creates keys, a few at a time: locks with the seed's lease.
func createSeedLocks(ctx context.Context, c client.Client, keys []string, lease time.Duration) {
	ch := make(chan string)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			defer GinkgoRecover()
			for key := range ch {
				createLockWith(ctx, c, key, int32(lease.Seconds()), 2)
			}
		})
	}
	for _, k := range keys {
		ch <- k
	}
	close(ch)
	wg.Wait()
}

func seedLog(format string, args ...any) {
	fmt.Printf(format+"\n", args...)
	GinkgoWriter.Printf(format+"\n", args...)
}
