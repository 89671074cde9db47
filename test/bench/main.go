// Command bench measures kubelock against the limit of its own stack and
// against what users would pick instead, on one machine in one run.
//
// It starts test/testenv's etcd and kube-apiserver (the control plane that `make
// control-plane` builds, started by internal/localcluster), the operator binary (go build ./cmd/manager) as a
// child process with leader election and the validating webhook served with a
// certificate from a CA it creates, and a redis-server on a free loopback port.
// kubelock runs with each admission engine in turn — the webhook, the
// ValidatingAdmissionPolicy from config/policy, none — and the baselines run on
// the same apiserver, etcd and machine: raw resourceVersion CAS on
// coordination.k8s.io/v1 Leases, client-go leader election with its default
// timings, etcd's concurrency.Mutex, and redsync.
//
// Workloads (open loop: requests are issued on a schedule and latency is
// measured from the scheduled time, so queueing counts):
//
//  1. seed mix: N lock objects; held locks renewed every lease/3 plus
//     acquire/release churn at the seed's 1:1:1 ratio, raised step by step
//     until p99 exceeds the limit or errors appear, then bisected between
//     the last sustained and the first unsustained rate;
//  2. uncontended acquire + release at a fixed rate, first on locks never
//     taken before in the run (a read and a write), then on a few locks each
//     taken over and over by its own client (kubelock writes from the last
//     object it saw); the requests of each operation are counted;
//  3. contended hand-off: K clients on one lock;
//  4. expiry: a holder dies without releasing; time from its lease's end to
//     the next holder;
//  5. holding only: N clients each hold 40 locks and renew them, without
//     and with sessions (one renewal per client instead of one per lock);
//  6. scale (runs last): the operator's memory with all N locks cached, none
//     and 20,000 of them held and after a restart that relists them, and how
//     late leases lapsing meanwhile are expired.
//
// The lock apiserver backend (system apiserver) runs workloads 1 to 3 on a
// control plane of its own: kubelock-apiserver serves the lock API there
// through an APIService from an etcd of its own (a group version is served
// by the CRD or by an APIService, never both). With an operator started
// there it also runs workload 5 and, grown to N locks, workload scale, with
// kubelock-apiserver's and its etcd's memory and the time a replica started
// at that scale takes to serve (lockbackend.go). With --scale-model the seed
// mix also runs on 1, 2 and 3 replicas of it, each held to the same CPU
// quota by a cgroup, clients straight to the replicas (scalemodel.go).
//
// With --encoding json,cbor the apiserver runs with the CBORServingAndStorage
// gate and every kubelock engine runs workloads 1, 2 and 5 twice: with
// pkg/lock speaking JSON and speaking CBOR (cbor.go).
//
// The results go to stdout and to docs/benchmarks.md with PNG plots beside it.
// Run it with `make bench` (default, < 20 min on 2 cores) or `make bench-quick`.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap/zapcore"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/kubelock/kubelock/test/testenv"
)

// System names in the report.
const (
	sysWebhook = "kubelock (webhook)"
	sysPolicy  = "kubelock (policy)"
	sysNone    = "kubelock (none)"
	sysLease   = "raw Lease CAS"
	sysBare    = "raw CRD CAS"
	sysLE      = "client-go leaderelection"
	sysKLE     = "client-go leaderelection on kubelock"
	sysEtcd    = "etcd Mutex"
	sysRedis   = "redsync"
	// sysAPIServer is the lock apiserver backend, through kube-apiserver;
	// sysAPIServerDirect the same with its clients talking straight to
	// kubelock-apiserver (as through its Service; workloads 1, 2, 3 and 5).
	sysAPIServer       = "kubelock (apiserver)"
	sysAPIServerDirect = "kubelock (apiserver, direct)"
)

type options struct {
	quick          bool
	locks          int
	leaseObjects   int
	rates          string
	rateScale      float64
	bisectAbs      float64
	bisectRel      float64
	maxSteps       int
	stepWarmup     time.Duration
	stepMeasure    time.Duration
	p99Limit       time.Duration
	lease          time.Duration
	churnHold      time.Duration
	uncRate        float64
	uncMeasure     time.Duration
	uncRounds      int
	pairedRate     float64
	pairedRounds   int
	handoffK       int
	handoffHold    time.Duration
	handoffMeasure time.Duration
	leMeasure      time.Duration
	expiryTrials   int
	expiryLease    time.Duration
	holdClients    int
	holdPerClient  int
	holdMeasure    time.Duration
	encoding       string
	systems        string
	workloads      string
	out            string
	workDir        string
	keep           bool
	profile        bool
	profileStep    int
	maxInFlight    int
	clients        int
	scaleHeld      int
	scaleHoldRate  float64
	scaleLapses    int
	scaleLapse     time.Duration
	scaleModel     bool
	scaleQuota     float64
	scaleReplicas  int
	scaleClients   int
	scaleRates     string
	scaleSteps     int
}

func defaults(quick bool) options {
	o := options{
		// Steps double, then bisection narrows the bracket; short steps keep
		// the default run, 100,000 locks included, within 15 min on 2 cores.
		locks: 100000, leaseObjects: 20000, rates: "150,300,600,1200,2400", rateScale: 1,
		bisectAbs: 25, bisectRel: 0.05, maxSteps: 6,
		stepWarmup: 2 * time.Second, stepMeasure: 6 * time.Second, p99Limit: 200 * time.Millisecond,
		lease: 30 * time.Second, churnHold: 200 * time.Millisecond,
		uncRate: 40, uncMeasure: 10 * time.Second, uncRounds: 4, pairedRounds: 2,
		handoffK: 8, handoffHold: 10 * time.Millisecond, handoffMeasure: 10 * time.Second, leMeasure: 30 * time.Second,
		expiryTrials: 3, expiryLease: 3 * time.Second,
		holdClients: 10, holdPerClient: 40, holdMeasure: 10 * time.Second, encoding: encJSON,
		systems: "webhook,policy,none,lease,crd,apiserver,apiserver-direct,leaderelection,kubelock-le,etcd,redis", workloads: "1,2,3,4,5,scale",
		out: "docs/benchmarks.md", profile: true, profileStep: 0, maxInFlight: 4000, clients: 4,
		scaleHeld: 20000, scaleHoldRate: 150, scaleLapses: 200, scaleLapse: 5 * time.Second,
		// A replica held to 0.4 core sustains a few hundred writes/s: the
		// steps start lower and rise by less than the seed mix's, so that
		// the bisection has fewer steps to go.
		scaleQuota: 0.4, scaleReplicas: 3, scaleClients: 6, scaleRates: "50,100,200,300,450,650,900,1300", scaleSteps: 8,
	}
	if quick {
		o.locks, o.leaseObjects, o.rates, o.maxSteps, o.holdClients = 5000, 5000, "150,300,600", 4, 5
		o.stepWarmup, o.stepMeasure = time.Second, 3*time.Second
		o.uncMeasure, o.handoffK, o.handoffMeasure, o.leMeasure = 2500*time.Millisecond, 4, 2500*time.Millisecond, 5*time.Second
		o.expiryTrials, o.expiryLease = 2, time.Second
		o.scaleHeld, o.scaleLapses, o.scaleLapse = 400, 40, 2*time.Second
		o.scaleSteps = 5
	}
	return o
}

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	quick := slices.Contains(args, "--quick") || slices.Contains(args, "-quick") || slices.Contains(args, "--quick=true")
	o := defaults(quick)
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.Usage = func() { printUsage(fs) }
	bindFlags(fs, &o)
	summarize := fs.String("summarize-profile", "", "Only print the summary of a CPU profile file (as the report shows it) and exit.")
	writes := fs.Int("write-cost", 0, "Only run the write-cost experiment with at least this many status writes per variant and exit: the CPU per write of every process on its path for the DistributedLock CRD (as shipped: with kubelock's webhook, the operator serving it on the path; with its policy; without admission, without CEL, unvalidated), the bare CRD, a Lease, and kubelock-apiserver (JSON and CBOR storage, through kube-apiserver and straight), with the lock apiserver's gate.")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *summarize != "" {
		fmt.Print(profileSummary(*summarize))
		return 0
	}
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.ErrorLevel)))
	if *writes > 0 {
		if err := allowCBOR(); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			return 1
		}
		if err := writeCost(context.Background(), *writes); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			return 1
		}
		return 0
	}
	if o.leaseObjects > o.locks {
		o.leaseObjects = o.locks
	}
	encodings, err := parseEncodings(o.encoding)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 2
	}
	if slices.Contains(encodings, encCBOR) {
		if err := allowCBOR(); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			return 1
		}
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	// client-go's leader election logs every attempt through klog.
	klog.LogToStderr(false)
	klog.SetOutput(io.Discard)
	if err := bench(ctx, o, os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	return 0
}

// printUsage prints what the benchmark does and its flags.
func printUsage(fs *flag.FlagSet) {
	fmt.Fprintf(fs.Output(), `Usage: go -C test/bench run . [flags]

Run from the repository root (test/bench is a Go module of its own); make bench
and make bench-quick run it this way.

Benchmarks kubelock (webhook, ValidatingAdmissionPolicy and no admission, and the
lock apiserver backend on a control plane of its own) against raw Lease CAS on the
same apiserver (the stack's limit), client-go leader election, etcd's
concurrency.Mutex and redsync, on a control plane and operator it starts itself.
Needs 'make control-plane' and redis-server (hack/install-redis.sh).
Writes a Markdown report (stdout and --out) and PNG plots beside --out.

Flags (defaults shown are for a default run; --quick changes them, see below):
`)
	fs.PrintDefaults()
	q := defaults(true)
	fmt.Fprintf(fs.Output(), "\n--quick presets: --locks %d --lease-objects %d --rates %s --max-steps %d --step-warmup %s --step-measure %s --uncontended-measure %s --handoff-clients %d --handoff-measure %s --leaderelection-measure %s --expiry-trials %d --expiry-lease %s --hold-clients %d (flags given after --quick override them)\n",
		q.locks, q.leaseObjects, q.rates, q.maxSteps, q.stepWarmup, q.stepMeasure, q.uncMeasure, q.handoffK, q.handoffMeasure, q.leMeasure, q.expiryTrials, q.expiryLease, q.holdClients)
}

// bindFlags binds each of o's fields to its flag in fs.
func bindFlags(fs *flag.FlagSet, o *options) {
	fs.BoolVar(&o.quick, "quick", o.quick, "Smoke-test preset: fewer locks, shorter windows, fewer steps (< 3 min on 2 cores).")
	fs.IntVar(&o.locks, "locks", o.locks, "N: DistributedLock objects created for the seed mix (creation is timed separately).")
	fs.IntVar(&o.leaseObjects, "lease-objects", o.leaseObjects, "Lease objects created for the raw-Lease baseline (at most --locks; enough for the held population and the churn).")
	fs.StringVar(&o.rates, "rates", o.rates, "Seed-mix coarse steps: offered lock writes/s (1/3 acquisitions, 1/3 renewals, 1/3 releases), before --rate-scale; run upwards until one is not sustained, then bisected.")
	fs.Float64Var(&o.rateScale, "rate-scale", o.rateScale, "Multiplies every offered rate (seed-mix steps and --uncontended-rate) to fit the machine.")
	fs.Float64Var(&o.bisectAbs, "bisect-width", o.bisectAbs, "Seed mix: bisection stops once the bracket (highest sustained, lowest not sustained) is at most this many writes/s wide...")
	fs.Float64Var(&o.bisectRel, "bisect-tolerance", o.bisectRel, "...or within ± this fraction of its middle.")
	fs.IntVar(&o.maxSteps, "max-steps", o.maxSteps, "Seed mix: at most this many steps per system, coarse and bisection together (bounds the run's time).")
	fs.DurationVar(&o.stepWarmup, "step-warmup", o.stepWarmup, "Warm-up before each measured window.")
	fs.DurationVar(&o.stepMeasure, "step-measure", o.stepMeasure, "Measured window of each seed-mix step.")
	fs.DurationVar(&o.p99Limit, "p99-limit", o.p99Limit, "A seed-mix step is sustained while p99 stays within this, with no errors and >= 90% of the offered rate completed.")
	fs.DurationVar(&o.lease, "lease", o.lease, "Lease of the seed mix's held locks; they renew every lease/3.")
	fs.DurationVar(&o.churnHold, "churn-hold", o.churnHold, "How long a churn acquisition holds its lock before releasing.")
	fs.Float64Var(&o.uncRate, "uncontended-rate", o.uncRate, "Workload 2: acquire+release pairs/s (before --rate-scale).")
	fs.DurationVar(&o.uncMeasure, "uncontended-measure", o.uncMeasure, "Workload 2: measured window.")
	fs.Float64Var(&o.pairedRate, "paired-rate", o.pairedRate, "With two encodings: the seed-mix rate (before --rate-scale) both run in alternating windows after their own searches; 0: the lower of their highest sustained rates.")
	fs.IntVar(&o.pairedRounds, "paired-rounds", o.pairedRounds, "With two encodings: rounds of the paired seed-mix step, each one window per encoding, in ABBA order.")
	fs.IntVar(&o.uncRounds, "uncontended-rounds", o.uncRounds, "Workload 2 with two encodings: the window is split into this many rounds per encoding, alternating between them.")
	fs.IntVar(&o.handoffK, "handoff-clients", o.handoffK, "Workload 3: K clients contending for one lock.")
	fs.DurationVar(&o.handoffHold, "handoff-hold", o.handoffHold, "Workload 3: how long each holder keeps the lock.")
	fs.DurationVar(&o.handoffMeasure, "handoff-measure", o.handoffMeasure, "Workload 3: measured window (kubelock, etcd, redsync).")
	fs.DurationVar(&o.leMeasure, "leaderelection-measure", o.leMeasure, "Workload 3: measured window for client-go leader election (2 s retry period).")
	fs.IntVar(&o.expiryTrials, "expiry-trials", o.expiryTrials, "Workload 4: dead holders per system (run in parallel).")
	fs.DurationVar(&o.expiryLease, "expiry-lease", o.expiryLease, "Workload 4: lease of kubelock's and etcd's dead holder (leader election uses its default 15 s).")
	fs.IntVar(&o.holdClients, "hold-clients", o.holdClients, "Workload 5: clients, each holding --hold-locks-per-client locks.")
	fs.IntVar(&o.holdPerClient, "hold-locks-per-client", o.holdPerClient, "Workload 5: locks each client holds.")
	fs.DurationVar(&o.holdMeasure, "hold-measure", o.holdMeasure, "Workload 5: measured window (at least lease/3, so every holding renews in it).")
	fs.StringVar(&o.encoding, "encoding", o.encoding, "Wire encodings of the kubelock clients: json, cbor or json,cbor. With cbor the apiserver runs with --feature-gates=CBORServingAndStorage=true (alpha, off by default) and workloads 1, 2 and 5 run once per encoding; the other workloads use JSON.")
	fs.StringVar(&o.systems, "systems", o.systems, "Comma-separated systems: webhook, policy, none (kubelock's admission engines), lease, crd (raw CRD CAS: a custom resource with a Lease's fields, no CEL, no admission: the floor of any CRD-based lock), apiserver (the lock apiserver backend: kubelock-apiserver on a control plane of its own, pkg/lock through kube-apiserver; workloads 1, 2, 3, 5 and scale), apiserver-direct (the same backend, pkg/lock talking straight to kubelock-apiserver, as through its Service), leaderelection (client-go on a Lease), kubelock-le (client-go on a DistributedLock, pkg/lock/leaderelection), etcd, redis.")
	fs.StringVar(&o.workloads, "workloads", o.workloads, "Comma-separated workloads to run: 1 seed mix, 2 uncontended, 3 hand-off, 4 expiry, 5 holding only (without and with sessions), scale (the operator's memory and expiry lateness at --locks; runs last, restarts the operator).")
	fs.IntVar(&o.scaleHeld, "scale-held", o.scaleHeld, "Workload scale: locks held (lease 300s, renewed by pkg/lock every 100s) while memory is measured.")
	fs.Float64Var(&o.scaleHoldRate, "scale-hold-rate", o.scaleHoldRate, "Workload scale: acquisitions/s of the held locks (before --rate-scale).")
	fs.IntVar(&o.scaleLapses, "scale-lapses", o.scaleLapses, "Workload scale: leases that lapse in each expiry round.")
	fs.DurationVar(&o.scaleLapse, "scale-lapse-lease", o.scaleLapse, "Workload scale: lease of the lapsing holdings.")
	fs.BoolVar(&o.scaleModel, "scale-model", o.scaleModel, "Also run the lock apiserver's scale model (last but scale): the seed mix with 1, 2, … --scale-replicas replicas of kubelock-apiserver on one lock store, each in a cgroup v1 of its own held to --scale-quota cores (needs root and /sys/fs/cgroup/cpu; reported as not run otherwise), clients straight to the replicas.")
	fs.Float64Var(&o.scaleQuota, "scale-quota", o.scaleQuota, "Scale model: CPU quota of each replica, in cores.")
	fs.IntVar(&o.scaleReplicas, "scale-replicas", o.scaleReplicas, "Scale model: the most replicas.")
	fs.IntVar(&o.scaleClients, "scale-clients", o.scaleClients, "Scale model: lock clients, spread evenly over the replicas (a multiple of 1, 2 and 3 keeps it even).")
	fs.StringVar(&o.scaleRates, "scale-rates", o.scaleRates, "Scale model: the seed mix's coarse steps (before --rate-scale).")
	fs.IntVar(&o.scaleSteps, "scale-max-steps", o.scaleSteps, "Scale model: at most this many seed-mix steps per replica count.")
	fs.StringVar(&o.out, "out", o.out, "Markdown report; the PNG plots go beside it. Empty: stdout only.")
	fs.StringVar(&o.workDir, "work-dir", o.workDir, "Folder for logs, certificates and profiles (default: a new temporary folder).")
	fs.BoolVar(&o.keep, "keep", o.keep, "Keep --work-dir (logs, profiles) after the run.")
	fs.BoolVar(&o.profile, "profile", o.profile, "CPU-profile kube-apiserver and this client during one seed-mix step of the webhook engine (and, with two encodings, during each encoding's first paired window).")
	fs.IntVar(&o.profileStep, "profile-step", o.profileStep, "Index (from 0) of the seed-mix step of the webhook engine to profile; none when the run stops before it.")
	fs.IntVar(&o.maxInFlight, "max-in-flight", o.maxInFlight, "Client-side bound on requests in flight; a request beyond it counts as an error.")
	fs.IntVar(&o.clients, "clients", o.clients, "Lock clients (connections) the open-loop workloads spread over.")
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

// report is everything the run measured.
type report struct {
	opts              options
	command           string
	started, finished time.Time
	loadStart         string
	loadEnd           string
	machine           []string
	created           int
	createTime        time.Duration
	leases            int
	leaseTime         time.Duration
	mgr               mgrStats
	mixes             []*mixResult
	uncontended       []*uncontendedResult
	handoffs          []*handoffResult
	expiries          []*expiryResult
	holds             []*holdResult
	paired            []pairedResult
	wire              []wireResult
	cborServer        bool
	profiles          []string
	scales            []*scaleResult // the operator at scale, one per backend that ran it
	replicas          *replicaScale
}

type mgrStats struct {
	rssStart, rssAfterCreate, peak int64
	cpuCreate                      usage
	createWall                     time.Duration
}

// bench runs every selected system's workloads on one cluster and writes
// the report.
func bench(ctx context.Context, o options, argv []string) error {
	b, err := newBenchRun(o, argv)
	if err != nil {
		return err
	}
	dir, err := workDir(o)
	if err != nil {
		return err
	}
	if !o.keep {
		defer func() { _ = os.RemoveAll(dir) }()
	}
	logf("load average at start: %s; work dir %s", b.rep.loadStart, dir)
	b.configure(dir)
	c, err := startCluster(ctx, dir, logf, b.rep.cborServer, b.systems["redis"])
	if err != nil {
		return err
	}
	defer c.stop()
	if err := b.attach(ctx, c); err != nil {
		return err
	}
	// kubelock with each engine, then the baselines; scale last, as it
	// restarts the operator.
	for _, step := range []func(context.Context) error{b.createObjects, b.runKubelock, b.runRawCAS, b.runAPIServer, b.runElections, b.runEtcd, b.runRedis, b.runScale} {
		if err := step(ctx); err != nil {
			return err
		}
	}
	return b.writeReport()
}

// runUncontendedBoth runs workload 2 on locks taken for the first time, then
// on locks taken again, counting requests and the apiserver's time of each.
func runUncontendedBoth(ctx context.Context, c *cluster, sys locker, name string, free pool, rate float64, o options, tr *trips) []*uncontendedResult {
	var out []*uncontendedResult
	for _, again := range []bool{false, true} {
		tr.reset()
		st0, _ := c.serverTimes(ctx)
		run := runUncontended
		if again {
			run = runUncontendedAgain
		}
		r := run(ctx, sys, name, free, rate, o.stepWarmup, o.uncMeasure, o.maxInFlight, tr)
		logUncontended(r)
		logServerTimes(ctx, c, st0)
		out = append(out, r)
	}
	return out
}

func logUncontended(r *uncontendedResult) {
	logf("  %-16s uncontended (%s): acquire p50 %v p99 %v, release p50 %v p99 %v, errors %d", r.System, r.kind(), r.Acquire.P50.Round(100*time.Microsecond), r.Acquire.P99.Round(100*time.Microsecond),
		r.Release.P50.Round(100*time.Microsecond), r.Release.P99.Round(100*time.Microsecond), r.Errors)
	if len(r.Trips) > 0 {
		logf("    requests: %s", tripsString(r.Trips))
	}
}

// logServerTimes logs the apiserver's mean time per kind of request since before.
func logServerTimes(ctx context.Context, c *cluster, before serverTime) {
	if before == nil {
		return
	}
	if now, err := c.serverTimes(ctx); err == nil {
		logf("    apiserver: %s", now.meanSince(before))
	}
}

// parseEncodings reads --encoding.
func parseEncodings(s string) ([]string, error) {
	var out []string
	for _, e := range strings.Split(s, ",") {
		e = strings.ToLower(strings.TrimSpace(e))
		switch e {
		case encJSON, encCBOR:
			if !slices.Contains(out, e) {
				out = append(out, e)
			}
		default:
			return nil, fmt.Errorf("--encoding: %q is neither json nor cbor", e)
		}
	}
	return out, nil
}

// cborName is the report's name of an engine's CBOR variant.
func cborName(system string) string {
	return strings.TrimSuffix(system, ")") + ", CBOR)"
}

// pairedResult is one engine's paired seed-mix step over its encodings.
type pairedResult struct {
	Names  []string
	Steps  []stepResult
	Rounds int
}

// pairedRate is the rate all of mixes sustained (the lowest of their highest
// sustained rates) or, when one sustained none, the lowest rate any ran.
func pairedRate(mixes []*mixResult) float64 {
	rate, lowest, none := math.Inf(1), math.Inf(1), false
	for _, m := range mixes {
		if m.Bracket.Sustained <= 0 {
			none = true
		}
		rate = min(rate, m.Bracket.Sustained)
		for _, st := range m.Steps {
			lowest = min(lowest, st.Offered)
		}
	}
	switch {
	case !none && !math.IsInf(rate, 1):
		return rate
	case !math.IsInf(lowest, 1):
		return lowest
	}
	return 0
}

// wireResult says how the apiserver answered one kubelock client set.
type wireResult struct {
	System, Encoding string
	Answers          string  // media types by method, with counts
	CBORShare        float64 // of all answers
}

func logHandoff(r *handoffResult) {
	logf("  %-16s hand-off: %d holdings (%.1f/s), p50 %v p99 %v, overtakes %d/%d, server-side FIFO violations %d/%d, errors %d%s", r.System, r.Holdings, r.PerSecond,
		r.Handoff.P50.Round(time.Millisecond), r.Handoff.P99.Round(time.Millisecond), r.FIFOViolations, r.FIFOChecked, r.ServerFIFOViolations, r.ServerFIFOChecked, r.Errors, firstKind(r.ErrKinds))
	if len(r.Trips) > 0 {
		logf("    requests: %s", tripsString(r.Trips))
	}
}

func logExpiry(r *expiryResult) {
	logf("  %-16s expiry: %d trials, p50 %v max %v, errors %d%s", r.System, r.Trials, r.Expiry.P50.Round(time.Millisecond), r.Expiry.Max.Round(time.Millisecond), r.Errors, firstKind(r.ErrKinds))
}

func machineInfo() []string {
	var out []string
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "model name") {
				_, v, _ := strings.Cut(line, ":")
				out = append(out, "CPU: "+strings.TrimSpace(v))
				break
			}
		}
	}
	out = append(out, fmt.Sprintf("cores visible to Go: %d", runtime.NumCPU()))
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "MemTotal:") {
				f := strings.Fields(line)
				if len(f) >= 2 {
					kb, _ := strconv.ParseInt(f[1], 10, 64)
					out = append(out, "memory: "+mib(kb*1024))
				}
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		out = append(out, "Linux "+strings.TrimSpace(string(b)))
	}
	out = append(out, "Go "+runtime.Version())
	out = append(out, "control plane: "+filepath.Base(testenv.AssetsDir())+" (envtest's flags: one etcd member with --unsafe-no-fsync=true, so etcd commits are not bounded by disk syncs)")
	return out
}

func mib(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }
