package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/dynamic"

	"github.com/kubelock/kubelock/controllers"
	"github.com/kubelock/kubelock/test/testenv"
)

// benchRun is one run of the benchmark: what it runs, the cluster it runs
// on, the settings the workloads share, and the report they fill.
type benchRun struct {
	o         options
	encodings []string
	systems   map[string]bool
	wl        map[string]bool // the workloads
	rep       *report

	mix        mixConfig
	hold       holdConfig
	uncRate    float64
	lockPool   pool      // the seed mix's locks, shared by every kubelock engine
	scaleRates []float64 // the scale model's seed-mix steps

	c       *cluster
	mgrProc proc
	pw      *procWatch
}

// newBenchRun reads what o asks for and starts the report. It moves to the
// repository's root, where the run reads config/ and writes --out.
func newBenchRun(o options, argv []string) (*benchRun, error) {
	encodings, err := parseEncodings(o.encoding)
	if err != nil {
		return nil, err
	}
	rates, err := parseRates("--rates", o.rates, o.rateScale)
	if err != nil {
		return nil, err
	}
	scaleRates, err := parseRates("--scale-rates", o.scaleRates, o.rateScale)
	if err != nil {
		return nil, err
	}
	if err := os.Chdir(testenv.RepoRoot()); err != nil {
		return nil, err
	}
	rep := &report{opts: o, started: time.Now(), loadStart: loadAvg(), machine: machineInfo(), cborServer: slices.Contains(encodings, encCBOR)}
	rep.command = strings.TrimSpace("go -C test/bench run . " + strings.Join(argv[1:], " "))
	return &benchRun{o: o, encodings: encodings, systems: commaSet(o.systems), wl: commaSet(o.workloads), rep: rep,
		mix: mixConfig{lease: o.lease, churnHold: o.churnHold, warmup: o.stepWarmup, measure: o.stepMeasure,
			rates: rates, absTol: o.bisectAbs * o.rateScale, relTol: o.bisectRel, maxSteps: o.maxSteps,
			p99Limit: o.p99Limit, maxInFlight: o.maxInFlight, profileStep: -1, objects: o.locks},
		hold:    holdConfig{clients: o.holdClients, perClient: o.holdPerClient, lease: o.lease, measure: max(o.holdMeasure, o.lease/3)},
		uncRate: o.uncRate * o.rateScale, lockPool: newPool(o.locks), scaleRates: scaleRates,
	}, nil
}

// parseRates reads the rates of flag name, each scaled.
func parseRates(name, s string, scale float64) ([]float64, error) {
	var rates []float64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		rates = append(rates, v*scale)
	}
	return rates, nil
}

// commaSet is the set of a comma-separated list's items.
func commaSet(s string) map[string]bool {
	set := map[string]bool{}
	for _, item := range strings.Split(s, ",") {
		set[strings.TrimSpace(item)] = true
	}
	return set
}

// workDir is --work-dir, created, or a new temporary folder.
func workDir(o options) (string, error) {
	dir := o.workDir
	if dir == "" {
		d, err := os.MkdirTemp("", "kubelock-bench-")
		if err != nil {
			return "", err
		}
		dir = d
	}
	return dir, os.MkdirAll(dir, 0o755)
}

// configure keeps the seed mix's profiles in dir.
func (b *benchRun) configure(dir string) { b.mix.profileDir = dir }

// attach watches c's processes, the operator's memory from now on, and
// turns on the default admission engine.
func (b *benchRun) attach(ctx context.Context, c *cluster) error {
	b.c = c
	b.mgrProc = proc{name: "manager", pid: c.mgr.Pid()}
	b.pw = &procWatch{procs: append([]proc{b.mgrProc}, childProcs()...)}
	b.rep.mgr.rssStart, _ = b.mgrProc.mem()
	return c.activate(ctx, engineWebhook)
}

// createObjects creates the seed mix's locks, when a kubelock engine or the
// scale workload uses them, and the baselines' objects.
func (b *benchRun) createObjects(ctx context.Context) error {
	if !b.wl["1"] && !b.wl["2"] && !b.wl["5"] && !b.wl["scale"] {
		return nil
	}
	if b.wl["scale"] || slices.ContainsFunc(kubelockEngines, func(en kubelockEngine) bool { return b.systems[en.key] }) {
		if err := b.createSeedLocks(ctx); err != nil {
			return err
		}
	}
	return b.createBaselineObjects(ctx)
}

// createSeedLocks creates the N locks, timing their creation and what the
// operator spends caching them.
func (b *benchRun) createSeedLocks(ctx context.Context) error {
	o, rep := b.o, b.rep
	logf("creating %d DistributedLocks in namespace %s", o.locks, lockNS)
	u0 := b.pw.snap()
	var err error
	if rep.createTime, err = createLocks(ctx, b.c.env.Client, o.locks); err != nil {
		return err
	}
	rep.created = o.locks
	// Let the operator's informer and first reconciles settle.
	time.Sleep(3 * time.Second)
	rep.mgr.createWall = rep.createTime + 3*time.Second
	rep.mgr.cpuCreate = b.pw.snap().since(u0)
	rep.mgr.rssAfterCreate, _ = b.mgrProc.mem()
	logf("created %d locks in %s (%.0f/s); operator RSS %s, CPU %.1fs", o.locks, rep.createTime.Round(time.Millisecond),
		float64(o.locks)/rep.createTime.Seconds(), mib(rep.mgr.rssAfterCreate), rep.mgr.cpuCreate["manager"])
	return nil
}

// createBaselineObjects creates the Leases and the bare CRD's locks of raw CAS.
func (b *benchRun) createBaselineObjects(ctx context.Context) error {
	o := b.o
	if b.systems["lease"] {
		var err error
		if b.rep.leaseTime, err = createLeases(ctx, b.c.adminCS, o.leaseObjects); err != nil {
			return err
		}
		b.rep.leases = o.leaseObjects
		logf("created %d Leases in %s", o.leaseObjects, b.rep.leaseTime.Round(time.Millisecond))
	}
	if !b.systems["crd"] {
		return nil
	}
	if err := installBareCRD(b.c); err != nil {
		return fmt.Errorf("installing the bare CRD: %w", err)
	}
	dc, err := dynamic.NewForConfig(b.c.admin)
	if err != nil {
		return err
	}
	d, err := createBareLocks(ctx, dc, o.leaseObjects)
	if err != nil {
		return err
	}
	logf("created %d bare CRD locks in %s", o.leaseObjects, d.Round(time.Millisecond))
	return nil
}

// runScale records the operator's peak memory so far, then runs the scale
// workload, which restarts the operator.
func (b *benchRun) runScale(ctx context.Context) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	_, b.rep.mgr.peak = b.mgrProc.mem()
	if !b.wl["scale"] {
		return nil
	}
	b.rep.scales = append(b.rep.scales, runScale(ctx, b.c, "the CRD", b.lockPool, b.scaleConfig(), nil, logf))
	return ctx.Err()
}

// scaleConfig is workload scale's, from the options.
func (b *benchRun) scaleConfig() scaleConfig {
	o := b.o
	return scaleConfig{locks: o.locks, held: min(o.scaleHeld, o.locks), holdLease: 300 * time.Second, holdRate: o.scaleHoldRate * o.rateScale,
		lapses: o.scaleLapses, lapseLease: o.scaleLapse, lapseOver: 4 * o.scaleLapse, workers: 8, grace: controllers.DefaultExpiryGrace}
}

// writeReport prints the report and writes it to --out.
func (b *benchRun) writeReport() error {
	rep := b.rep
	rep.finished = time.Now()
	rep.loadEnd = loadAvg()
	logf("load average at end: %s; took %s", rep.loadEnd, rep.finished.Sub(rep.started).Round(time.Second))
	md := rep.markdown(b.o.out)
	fmt.Print(md)
	if b.o.out == "" {
		return nil
	}
	if err := rep.write(b.o.out, md); err != nil {
		return err
	}
	logf("wrote %s", b.o.out)
	return nil
}

// addHandoff logs and reports a hand-off result.
func (b *benchRun) addHandoff(r *handoffResult) {
	logHandoff(r)
	b.rep.handoffs = append(b.rep.handoffs, r)
}

// addExpiry logs and reports an expiry result.
func (b *benchRun) addExpiry(r *expiryResult) {
	logExpiry(r)
	b.rep.expiries = append(b.rep.expiries, r)
}

// addHold logs and reports a holding-only result.
func (b *benchRun) addHold(r *holdResult) {
	logHold(r)
	b.rep.holds = append(b.rep.holds, r)
}
