package integration

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/history"
	"github.com/kubelock/kubelock/test/suite"
)

// The model-based test: several clients run random sequences of TryAcquire,
// Acquire with a short wait, Renew, Release, crash (stop renewing and forget the
// lock), retry (Acquire again with an earlier call's request ID) and waits for
// an expiry against one lock on the real apiserver, with the expiry controller
// running: a Mutex; an RWMutex, whose clients acquire as readers or as the
// writer at random; a Semaphore of 2 permits among 4 clients. The clients'
// calls and every read of the stored object are recorded as test/history
// events, whose checkers (the fault suite's) check I1 (never a writer together
// with anyone, never two holders on one slot, never more holders than
// permits), I2 (tokens rise, per slot and for the lock) and I6 after every
// step, next to the stored object's own invariants; the whole history is
// then checked for linearizability against test/history's model.
//
// Environment:
//
//	KUBELOCK_MODEL_SEED       seed of the random workload (default: the clock)
//	KUBELOCK_MODEL_SECONDS    how long to generate operations (default 40, at most 60)
//	KUBELOCK_MODEL_OPS        stop after this many operations (default 2000)
//	KUBELOCK_MODEL_HISTORY    if set, write the history to a temporary file even when the test passes
//	KUBELOCK_MODEL_VISUALIZE  if set, write porcupine's visualization even when the history is linearizable
var _ = backends.Describe("model-based randomized test", Serial, func() {
	for _, spec := range []locksv1alpha1.DistributedLockSpec{
		{Type: locksv1alpha1.Mutex},
		{Type: locksv1alpha1.RWMutex},
		{Type: locksv1alpha1.Semaphore, Permits: int32p(2)},
	} {
		It(fmt.Sprintf("keeps I1, I2 and I6 after every step and a linearizable history: %s", describeType(spec)), func() {
			runModel(spec)
		})
	}
})

func describeType(spec locksv1alpha1.DistributedLockSpec) string {
	if spec.Permits != nil {
		return fmt.Sprintf("%s of %d permits", spec.Type, *spec.Permits)
	}
	return string(spec.Type)
}

func runModel(spec locksv1alpha1.DistributedLockSpec) {
	seed := envInt("KUBELOCK_MODEL_SEED", time.Now().UnixNano())
	seconds := min(envInt("KUBELOCK_MODEL_SECONDS", 40), 60)
	maxOps := int(envInt("KUBELOCK_MODEL_OPS", 2000))
	GinkgoWriter.Printf("%s model seed %d (replay with KUBELOCK_MODEL_SEED=%d), %ds, at most %d operations\n", describeType(spec), seed, seed, seconds, maxOps)

	r := newModelRun(seed, spec)
	DeferCleanup(func() {
		if CurrentSpecReport().Failed() || os.Getenv("KUBELOCK_MODEL_HISTORY") != "" {
			r.dumpHistory()
		}
	})
	began := time.Now()
	r.run(time.Duration(seconds)*time.Second, maxOps)
	r.drain()
	ran := time.Since(began)

	r.mu.Lock()
	kinds := make([]string, 0, len(r.counts))
	for k, n := range r.counts {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
	}
	sort.Strings(kinds)
	report := fmt.Sprintf("%s, seed %d: %d operations in %d steps over %s (%d clients, %d acquisitions, %d crashes, %d expiries seen, %d phantom acquisitions, at most %d holdings at once); %s",
		describeType(spec), seed, len(r.ops), r.rounds, ran.Round(time.Millisecond), len(r.clients), len(r.acqs), r.counts["crash"],
		r.expiries, r.phantoms, r.mostHeld, strings.Join(kinds, ", "))
	r.mu.Unlock()
	AddReportEntry("model", report)
	GinkgoWriter.Println(report)

	r.checkLinearizable()
}

func envInt(name string, def int64) int64 {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.ParseInt(v, 10, 64)
	Expect(err).NotTo(HaveOccurred(), "%s=%q", name, v)
	return n
}

const modelKey = "model"

// modelClient is one user of the lock. It acquires through auto, a client
// that renews in the background, or through manual, a client without
// background renewal whose holdings the test renews itself until it crashes.
type modelClient struct {
	idx   int
	user  string
	cfg   *rest.Config
	auto  *lock.Client
	man   *lock.Client // replaced after every crash: a crashed process is gone
	procs int
	reqs  int
	cur   *modelHolding // the holding this client works with, nil when idle
	// succeeded are the request IDs of this client's successful acquisitions.
	succeeded []string
}

type modelHolding struct {
	l       *lock.Lock
	manual  bool
	stop    chan struct{} // manual: stops the test's renewals
	stopped chan struct{}
}

// modelAcq is one successful (non-retry) acquisition as its client saw it.
type modelAcq struct {
	client     int
	req, lease string
}

type trackedHandle struct {
	l *lock.Lock
	// lost records, once, that the holding ended for any reason but Release.
	// A second handle returned by a retry records nothing: a holding ends
	// with its first handle.
	lost func()
}

type modelRun struct {
	ctx   context.Context
	ns    string
	seed  int64
	rng   *rand.Rand // only the planning goroutine uses it
	start time.Time
	// typ is the lock's type and limit its SharedLimit: how many shared
	// holdings it admits at once (0 for a Mutex).
	typ   locksv1alpha1.LockType
	limit int

	mu       sync.Mutex
	ops      []porcupine.Operation
	events   []history.Event // the same calls, and every read of the stored object, for the I1, I2 and I6 checkers
	errs     []string
	counts   map[string]int
	handles  []trackedHandle // holding handles that may still be live
	acqs     map[string]modelAcq
	reqOwner map[string]int  // request ID -> client
	shared   map[string]bool // request IDs of shared acquires
	failed   map[string]bool // request IDs of acquires that timed out (possible phantom holdings)
	crashed  map[string]bool // leases whose client crashed
	ended    map[string]bool // leases seen in status.recentAcquisitions
	stored   map[string]bool // leases of the holdings seen in the stored object

	clients  []*modelClient
	rounds   int
	phantoms int
	expiries int
	mostHeld int                            // the most holdings a read showed at once
	last     *locksv1alpha1.DistributedLock // stored object after the last step
}

func newModelRun(seed int64, spec locksv1alpha1.DistributedLockSpec) *modelRun {
	ctx := context.Background()
	r := &modelRun{
		ctx: ctx, seed: seed, rng: rand.New(rand.NewPCG(uint64(seed), 0x6b75626c6f636b)),
		counts: map[string]int{}, acqs: map[string]modelAcq{}, reqOwner: map[string]int{}, shared: map[string]bool{},
		failed: map[string]bool{}, crashed: map[string]bool{}, ended: map[string]bool{}, stored: map[string]bool{},
	}
	r.ns = suite.Namespace(ctx)
	spec.LeaseDurationSeconds, spec.HandoffTimeoutSeconds = 1, 1
	obj := suite.NewLock(ctx, r.ns, modelKey, spec)
	r.typ, r.limit = obj.LockType(), obj.SharedLimit()
	const clients = 4
	for i := range clients {
		cfg, user := suite.UserConfig(ctx)
		c := &modelClient{idx: i, user: user, cfg: cfg}
		c.auto = r.process(c)
		c.man = r.process(c, lock.WithoutAutoRenew())
		r.clients = append(r.clients, c)
	}
	r.start = time.Now()
	r.last = r.get()
	return r
}

// process is a new lock client of c's user, as another process of it would be.
func (r *modelRun) process(c *modelClient, opts ...lock.Option) *lock.Client {
	c.procs++
	l, err := lock.New(c.cfg, append([]lock.Option{lock.WithNamespace(r.ns), lock.WithIdentity(fmt.Sprintf("%s-p%d", c.user, c.procs))}, opts...)...)
	Expect(err).NotTo(HaveOccurred())
	return l
}

func (r *modelRun) now() int64 { return time.Since(r.start).Nanoseconds() }

func (r *modelRun) msg(format string, args ...any) string {
	return fmt.Sprintf("[%s model seed %d, step %d] ", r.typ, r.seed, r.rounds) + fmt.Sprintf(format, args...)
}

func (r *modelRun) fail(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func (r *modelRun) record(client int, in history.Input, out history.Output, call, ret int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = append(r.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret})
}

// event records e for the history checkers, on the porcupine operations' clock.
func (r *modelRun) event(e history.Event) {
	e.Key = modelKey
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

func (r *modelRun) opCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ops)
}

func (r *modelRun) count(kind string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.counts[kind]++
}

func (r *modelRun) get() *locksv1alpha1.DistributedLock {
	l := &locksv1alpha1.DistributedLock{}
	Expect(env.Client.Get(r.ctx, clientKey(r.ns), l)).To(Succeed(), r.msg("reading the lock"))
	return l
}

// track registers a holding handle. A primary handle (the one its client
// works with) also records, when its Done fires for any reason but Release,
// the moment its client learned that it lost the lock; the operation starts
// at the client's safe deadline, which the watchdog waited for, so the model
// may place it as early as the loss really happened.
func (r *modelRun) track(c int, l *lock.Lock, primary bool) {
	t := trackedHandle{l: l, lost: func() {}}
	if primary {
		t.lost = sync.OnceFunc(func() { r.lost(c, l) })
		context.AfterFunc(l.Context(), t.lost)
	}
	r.mu.Lock()
	r.handles = append(r.handles, t)
	r.mu.Unlock()
}

func (r *modelRun) lost(c int, l *lock.Lock) {
	ret := r.now()
	cause := context.Cause(l.Context())
	if errors.Is(cause, lock.ErrReleased) {
		return
	}
	if !errors.Is(cause, lock.ErrLockLost) {
		r.fail("holding %s ended with %v, which wraps neither ErrReleased nor ErrLockLost", l.LeaseID(), cause)
	}
	call := min(ret, l.ExpiresAt().Sub(r.start).Nanoseconds())
	r.record(c, history.Input{Kind: history.KindAbandon, Lease: l.LeaseID()}, history.Output{}, call, ret)
	r.event(history.Event{Proc: procName(c), Op: history.OpLost, Phase: history.Point, Lease: l.LeaseID(), Token: l.FencingToken(), T: call})
	r.mu.Lock()
	crashed := r.crashed[l.LeaseID()]
	r.mu.Unlock()
	if crashed {
		r.count("lost-after-crash")
		return
	}
	// A holding that was renewed and still lost: slow renewals can do
	// that legitimately; the log says why.
	r.count("lost-while-renewing")
	GinkgoWriter.Printf("model: client %d lost lease %s at %s while renewing: %v\n", c, l.LeaseID(), time.Duration(ret), cause)
}

func procName(c int) string { return fmt.Sprintf("c%d", c) }

// acquired records the event of an acquire that returned a holding.
func (r *modelRun) acquired(c int, l *lock.Lock, ret int64) {
	slot, shared := l.Slot()
	r.event(history.Event{Proc: procName(c), Op: history.OpAcquire, Phase: history.Return, Req: l.RequestID(), Lease: l.LeaseID(), Token: l.FencingToken(), Outcome: history.OK, T: ret, Shared: shared, Slot: slot})
}

// checkMode checks that a holding is in the mode its acquire asked for and
// returns its slot.
func (r *modelRun) checkMode(c *modelClient, l *lock.Lock, shared bool) int32 {
	slot, ok := l.Slot()
	if ok != shared || l.Shared() != shared {
		r.fail("client %d: request %s asked for a shared holding: %v, got one with a slot: %v (Shared() %v)", c.idx, l.RequestID(), shared, ok, l.Shared())
	}
	return slot
}

// renewLoop renews a manual holding like the library's background renewal
// until the client crashes (stop) or the holding ends.
func renewLoop(l *lock.Lock, lease time.Duration, stop, stopped chan struct{}) {
	defer close(stopped)
	wait := lease / 3
	for {
		t := time.NewTimer(wait)
		select {
		case <-stop:
			t.Stop()
			return
		case <-l.Done():
			t.Stop()
			return
		case <-t.C:
		}
		ctx, cancel := context.WithDeadline(l.Context(), l.ExpiresAt())
		err := l.Renew(ctx)
		cancel()
		switch {
		case err == nil:
			wait = lease / 3
		case errors.Is(err, lock.ErrLockLost), errors.Is(err, lock.ErrReleased):
			return
		default:
			wait = lease / 12
		}
	}
}

// classify maps an acquire's error to the model's result.
func (r *modelRun) classify(err error, out *history.Output) bool {
	var locked *lock.LockedError
	switch {
	case err == nil:
		out.Outcome = history.OK
	case errors.As(err, &locked):
		out.Outcome, out.SharedHeld = history.Locked, locked.Shared
		out.Queued = locked.Holder == nil && locked.Shared == 0
		if locked.Holder != nil {
			out.Lease, out.Req = locked.Holder.LeaseID, locked.Holder.RequestID
		}
	case errors.Is(err, lock.ErrLocked):
		out.Outcome, out.Queued = history.Locked, true // the process's own slot is taken: never expected here
	case errors.Is(err, lock.ErrTimeout):
		out.Outcome = history.Timeout
	case errors.Is(err, lock.ErrLockLost):
		out.Outcome = history.Lost
	default:
		return false
	}
	return true
}

// modelOp is one planned operation of one client in a step.
type modelOp struct {
	name string // for reading a failure in a debugger
	run  func()
}

// plan picks the next operation of client c. Only the planning goroutine calls it.
func (r *modelRun) plan(c *modelClient, blocking *bool) modelOp {
	rng := r.rng
	think := time.Duration(rng.IntN(80)) * time.Millisecond
	if h := c.cur; h != nil && h.l.Err() != nil {
		// The client learns that its holding is over and goes on without it.
		if h.manual {
			close(h.stop)
			<-h.stopped
		}
		c.cur = nil
	}
	if h := c.cur; h != nil {
		choices := []string{"renew", "renew", "release", "release", "release", "retry-held", "retry-held", "observe", "hold"}
		if h.manual {
			choices = append(choices, "crash", "crash", "crash")
		}
		switch choice := choices[rng.IntN(len(choices))]; choice {
		case "renew":
			return modelOp{choice, func() { time.Sleep(think); r.renew(c, h) }}
		case "release":
			return modelOp{choice, func() { time.Sleep(think); r.release(c, h) }}
		case "crash":
			return modelOp{choice, func() { time.Sleep(think); r.crash(c, h) }}
		case "retry-held":
			*blocking = true
			req := h.l.RequestID()
			return modelOp{choice, func() { time.Sleep(think); r.retry(c, req, h.l.LeaseID()) }}
		case "observe":
			return modelOp{choice, func() { time.Sleep(think); r.observe(c.idx) }}
		default:
			d := time.Duration(20+rng.IntN(200)) * time.Millisecond
			return modelOp{choice, func() { time.Sleep(d) }}
		}
	}
	// Idle: acquire, retry an earlier request whose holding ended, or look.
	var ended []string
	if recent := r.last.Status.RecentAcquisitions; len(recent) > 0 {
		// Only the newest few: status remembers the last 8 holdings, and a
		// step ends at most 4, so these are still remembered when the retry runs.
		for _, f := range recent[max(0, len(recent)-4):] {
			if slices.Contains(c.succeeded, f.RequestID) {
				ended = append(ended, f.RequestID)
			}
		}
	}
	choices := []string{"try", "try", "try", "acquire", "acquire", "acquire", "observe"}
	if len(ended) > 0 {
		choices = append(choices, "retry-ended", "retry-ended")
	}
	choice := choices[rng.IntN(len(choices))]
	manual := rng.IntN(3) == 0
	lease := time.Duration(1+rng.IntN(2)) * time.Second
	switch choice {
	case "try", "acquire":
		try := choice == "try"
		wait := time.Duration(100+rng.IntN(800)) * time.Millisecond
		if rng.IntN(8) == 0 {
			wait = 2500 * time.Millisecond // long enough to outwait a crashed holder
		}
		if !try {
			*blocking = true
		}
		c.reqs++
		req := fmt.Sprintf("s%d-c%d-%d", r.seed%10000, c.idx, c.reqs)
		// An RWMutex's clients read or write at random; a Semaphore is
		// acquired shared with or without asking.
		shared := r.typ == locksv1alpha1.Semaphore || (r.typ == locksv1alpha1.RWMutex && rng.IntN(2) == 0)
		ask := shared && (r.typ == locksv1alpha1.RWMutex || rng.IntN(2) == 0)
		r.mu.Lock()
		r.shared[req] = shared
		r.mu.Unlock()
		return modelOp{choice, func() { time.Sleep(think); r.acquire(c, req, try, manual, ask, lease, wait, *blocking) }}
	case "retry-ended":
		*blocking = true
		req := ended[rng.IntN(len(ended))]
		orig := r.acqs[req].lease
		return modelOp{choice, func() { time.Sleep(think); r.retry(c, req, orig) }}
	default:
		return modelOp{choice, func() { time.Sleep(think); r.observe(c.idx) }}
	}
}

// handOver is a holder's operation in a step where others wait: hold a
// little, then release, or crash when it renews by itself.
func (r *modelRun) handOver(c *modelClient, h *modelHolding) modelOp {
	d := time.Duration(20+r.rng.IntN(500)) * time.Millisecond
	if h.manual && r.rng.IntN(3) == 0 {
		return modelOp{"crash", func() { time.Sleep(d); r.crash(c, h) }}
	}
	return modelOp{"release", func() { time.Sleep(d); r.release(c, h) }}
}

// mode is the acquire options and the model's input of request req's mode;
// ask says whether to ask for a shared holding with lock.WithShared() (a
// Semaphore's is shared without asking).
func (r *modelRun) mode(req string, ask bool, in *history.Input) []lock.AcquireOption {
	r.mu.Lock()
	shared := r.shared[req]
	r.mu.Unlock()
	in.Shared = shared
	if shared {
		in.Limit = r.limit
	}
	if ask && shared {
		return []lock.AcquireOption{lock.WithShared()}
	}
	return nil
}

func (r *modelRun) acquire(c *modelClient, req string, try, manual, askShared bool, lease, wait time.Duration, queueMaybe bool) {
	cl := c.auto
	if manual {
		cl = c.man
	}
	r.mu.Lock()
	r.reqOwner[req] = c.idx
	r.mu.Unlock()
	in := history.Input{Kind: history.KindAcquire, Req: req, Try: try, QueueMaybe: queueMaybe}
	opts := append(r.mode(req, askShared, &in), lock.WithRequestID(req), lock.WithLeaseDuration(lease))
	var (
		l   *lock.Lock
		err error
	)
	call := r.now()
	if try {
		l, err = cl.TryAcquire(r.ctx, modelKey, opts...)
	} else {
		l, err = cl.Acquire(r.ctx, modelKey, append(opts, lock.WithWaitTimeout(wait))...)
	}
	ret := r.now()
	out := history.Output{}
	if !r.classify(err, &out) || out.Outcome == history.Lost {
		r.fail("client %d: acquire %s: unexpected error %v", c.idx, req, err)
		return
	}
	if try {
		r.count("try-" + out.Outcome)
	} else {
		r.count("acquire-" + out.Outcome)
	}
	if out.Outcome == history.Timeout {
		r.mu.Lock()
		r.failed[req] = true
		r.mu.Unlock()
	}
	if err != nil {
		r.record(c.idx, in, out, call, ret)
		return
	}
	out.Lease, out.Token = l.LeaseID(), l.FencingToken()
	out.Slot = r.checkMode(c, l, in.Shared)
	if l.RequestID() != req {
		r.fail("client %d: acquire %s returned a holding of request %s", c.idx, req, l.RequestID())
	}
	r.record(c.idx, in, out, call, ret)
	r.acquired(c.idx, l, ret)
	r.mu.Lock()
	r.acqs[req] = modelAcq{client: c.idx, req: req, lease: l.LeaseID()}
	r.mu.Unlock()
	c.succeeded = append(c.succeeded, req)
	r.track(c.idx, l, true)
	h := &modelHolding{l: l, manual: manual}
	if manual {
		h.stop, h.stopped = make(chan struct{}), make(chan struct{})
		go renewLoop(l, lease, h.stop, h.stopped)
	}
	c.cur = h
}

// retry calls Acquire again with an earlier successful request ID of c, from a
// new process of the same user (I6). It must return the same lease while that
// holding lasts and ErrLockLost once it ended; never a second holding (the
// history checkers hold it to the lease and token the request got first).
func (r *modelRun) retry(c *modelClient, req, lease string) {
	p := r.process(c, lock.WithoutAutoRenew())
	in := history.Input{Kind: history.KindAcquire, Req: req, Retry: true, OrigLease: lease}
	// A retry asks for the mode its request asked for.
	opts := append(r.mode(req, r.typ == locksv1alpha1.RWMutex, &in), lock.WithRequestID(req), lock.WithWaitTimeout(3*time.Second))
	call := r.now()
	l, err := p.Acquire(r.ctx, modelKey, opts...)
	ret := r.now()
	out := history.Output{}
	if !r.classify(err, &out) {
		r.fail("client %d: retry of %s: unexpected error %v", c.idx, req, err)
		return
	}
	r.count("retry-" + out.Outcome)
	if l != nil {
		out.Lease, out.Token = l.LeaseID(), l.FencingToken()
		out.Slot = r.checkMode(c, l, in.Shared)
		r.acquired(c.idx, l, ret)
		// Another handle of the same holding; it does not renew and simply runs out.
		r.track(c.idx, l, false)
	} else if out.Outcome != history.Lost {
		r.fail("client %d: retry of %s returned %v; want the same lease or ErrLockLost (I6)", c.idx, req, err)
	}
	r.record(c.idx, in, out, call, ret)
}

// holderCall runs a holder's Renew or Release, which may return nil or
// ErrLockLost, and records it; false after any other error.
func (r *modelRun) holderCall(c *modelClient, h *modelHolding, kind history.Kind, name string, do func(context.Context) error) bool {
	ctx, cancel := context.WithTimeout(r.ctx, 10*time.Second)
	defer cancel()
	in := history.Input{Kind: kind, Lease: h.l.LeaseID()}
	call := r.now()
	err := do(ctx)
	ret := r.now()
	out := history.Output{Outcome: history.OK}
	switch {
	case err == nil:
	case errors.Is(err, lock.ErrLockLost):
		out.Outcome = history.Lost
	default:
		r.fail("client %d: %s %s: unexpected error %v", c.idx, name, in.Lease, err)
		return false
	}
	if kind == history.KindRelease && h.l.Err() == nil {
		r.fail("client %d: release %s returned %v but the lock's context is still live", c.idx, in.Lease, err)
	}
	if kind == history.KindRelease {
		r.event(history.Event{Proc: procName(c.idx), Op: history.OpRelease, Phase: history.Invoke, Lease: in.Lease, Token: h.l.FencingToken(), T: call})
	}
	r.count(name + "-" + out.Outcome)
	r.record(c.idx, in, out, call, ret)
	return true
}

func (r *modelRun) renew(c *modelClient, h *modelHolding) {
	r.holderCall(c, h, history.KindRenew, "renew", h.l.Renew)
}

func (r *modelRun) release(c *modelClient, h *modelHolding) {
	if !r.holderCall(c, h, history.KindRelease, "release", h.l.Release) {
		return
	}
	if h.manual {
		close(h.stop)
		<-h.stopped
	}
	c.cur = nil
}

// crash stops renewing a manual holding and forgets it without releasing, as
// a process that died would. Its Done fires at its safe deadline and the
// controller must expire the holding.
func (r *modelRun) crash(c *modelClient, h *modelHolding) {
	in := history.Input{Kind: history.KindCrash, Lease: h.l.LeaseID()}
	r.mu.Lock()
	r.crashed[in.Lease] = true
	r.mu.Unlock()
	call := r.now()
	close(h.stop)
	<-h.stopped
	ret := r.now()
	r.count("crash")
	r.record(c.idx, in, history.Output{}, call, ret)
	c.cur = nil
	c.man = r.process(c, lock.WithoutAutoRenew())
}

// read reads the stored lock as an admin and records what it shows for the
// history checkers: the ended holdings, oldest first, then the shared
// holdings, then the holder.
func (r *modelRun) read() (l *locksv1alpha1.DistributedLock, call, ret int64, err error) {
	call = r.now()
	l = &locksv1alpha1.DistributedLock{}
	err = env.Client.Get(r.ctx, clientKey(r.ns), l)
	ret = r.now()
	if err != nil {
		return nil, call, ret, err
	}
	for _, f := range l.Status.RecentAcquisitions {
		e := history.Event{Proc: "store", Op: history.OpServer, Phase: history.Point, Lease: f.LeaseID, Req: f.RequestID, Token: f.FencingToken, Reason: string(f.EndReason), T: ret}
		if f.Slot != nil {
			e.Shared, e.Slot = true, *f.Slot
		}
		r.event(e)
	}
	for _, h := range l.Status.SharedHolders {
		r.event(history.Event{Proc: "store", Op: history.OpServer, Phase: history.Return, Lease: h.LeaseID, Req: h.RequestID, Token: h.FencingToken, Shared: true, Slot: h.Slot, T: ret})
	}
	e := history.Event{Proc: "store", Op: history.OpServer, Phase: history.Return, Token: l.Status.FencingToken, Deadline: call, T: ret}
	if h := l.Status.Holder; h != nil {
		e.Lease, e.Req = h.LeaseID, h.RequestID
	}
	r.event(e)
	return l, call, ret, nil
}

// storedHolding is one holding of the stored object, exclusive or shared.
type storedHolding struct {
	locksv1alpha1.LockHolder
	shared bool
	slot   int32
	token  int64
}

// holdings are the stored object's holdings: the holder, then the shared ones.
func holdings(l *locksv1alpha1.DistributedLock) []storedHolding {
	var out []storedHolding
	if h := l.Status.Holder; h != nil {
		out = append(out, storedHolding{LockHolder: *h, token: l.Status.FencingToken})
	}
	for _, h := range l.Status.SharedHolders {
		out = append(out, storedHolding{LockHolder: h.LockHolder, shared: true, slot: h.Slot, token: h.FencingToken})
	}
	return out
}

// holds reports whether lease is one of the stored object's holdings.
func holds(l *locksv1alpha1.DistributedLock, lease string) bool {
	return slices.ContainsFunc(holdings(l), func(h storedHolding) bool { return h.LeaseID == lease })
}

func clientKey(ns string) client.ObjectKey { return client.ObjectKey{Namespace: ns, Name: modelKey} }

// observed records a read as an operation of the porcupine history.
func (r *modelRun) observed(client int, l *locksv1alpha1.DistributedLock, call, ret int64) {
	out := history.Output{Outcome: history.OK, Token: l.Status.FencingToken}
	if h := l.Status.Holder; h != nil {
		out.Lease, out.Req = h.LeaseID, h.RequestID
	}
	for _, h := range l.Status.SharedHolders {
		out.Shared = append(out.Shared, history.Seen{Lease: h.LeaseID, Req: h.RequestID, Slot: h.Slot, Token: h.FencingToken})
	}
	r.record(client, history.Input{Kind: history.KindObserve}, out, call, ret)
}

// observe is a client's read of the stored lock.
func (r *modelRun) observe(client int) {
	l, call, ret, err := r.read()
	if err != nil {
		r.fail("reading the lock: %v", err)
		return
	}
	r.count("observe")
	r.observed(client, l, call, ret)
}

// awaitExpiry waits until the controller expired a holding whose client was
// told it lost it (a crash, mostly). Only the last read enters the porcupine history.
func (r *modelRun) awaitExpiry(lease string) {
	Eventually(func(g Gomega) {
		l, call, ret, err := r.read()
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(holds(l, lease)).To(BeFalse())
		r.count("await-expiry")
		r.observed(len(r.clients), l, call, ret)
	}).WithTimeout(15*time.Second).WithPolling(50*time.Millisecond).Should(Succeed(),
		r.msg("the controller did not expire lease %s, lost by its client, within 15s", lease))
}

// abandoned are the leases of the stored holdings whose clients were told
// they lost them (a crash or a missed renewal) and that have no live handle.
func (r *modelRun) abandoned() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, h := range holdings(r.last) {
		if !slices.ContainsFunc(r.handles, func(t trackedHandle) bool { return t.l.LeaseID() == h.LeaseID && t.l.Err() == nil }) {
			out = append(out, h.LeaseID)
		}
	}
	return out
}

func (r *modelRun) run(d time.Duration, maxOps int) {
	end := time.Now().Add(d)
	for time.Now().Before(end) && r.opCount() < maxOps {
		r.rounds++
		if leases := r.abandoned(); len(leases) > 0 && r.rng.IntN(4) == 0 {
			// Now and then wait for the controller to expire a crashed holding.
			r.awaitExpiry(leases[r.rng.IntN(len(leases))])
			r.checkStep()
			continue
		}
		k := []int{1, 1, 1, 2, 2, 3}[r.rng.IntN(6)]
		picked := r.rng.Perm(len(r.clients))[:k]
		// A TryAcquire may find waiters queued only when a blocking Acquire
		// runs in the same step; the operations read queue once all are planned.
		var ops []modelOp
		queue := false
		for _, i := range picked {
			ops = append(ops, r.plan(r.clients[i], &queue))
		}
		// Mostly let the holder join a step in which others wait, so that
		// waiters get the lock handed over, not only time out.
		if queue && r.rng.IntN(4) != 0 {
			for _, c := range r.clients {
				if h := c.cur; h != nil && h.l.Err() == nil && !slices.Contains(picked, c.idx) {
					ops = append(ops, r.handOver(c, h))
				}
			}
		}
		var wg sync.WaitGroup
		for _, op := range ops {
			wg.Add(1)
			go func() {
				defer GinkgoRecover()
				defer wg.Done()
				op.run()
			}()
		}
		wg.Wait()
		r.checkStep()
	}
}

// checkStep checks the invariants after a step, with no operation running
// (only background renewals and the controller).
func (r *modelRun) checkStep() {
	r.mu.Lock()
	errs := slices.Clone(r.errs)
	r.mu.Unlock()
	Expect(errs).To(BeEmpty(), r.msg("operations failed"))

	// Read the stored object first: a handle live after the read was live
	// during it, so the read must show its holding (I1). A handle whose Done
	// fired has its end recorded before the check, even if its AfterFunc
	// has not run yet.
	s, _, _, err := r.read()
	Expect(err).NotTo(HaveOccurred(), r.msg("reading the lock"))
	r.mu.Lock()
	var done []trackedHandle
	kept := r.handles[:0]
	for _, t := range r.handles {
		if t.l.Err() == nil {
			kept = append(kept, t)
		} else {
			done = append(done, t)
		}
	}
	clear(r.handles[len(kept):])
	r.handles = kept
	r.mu.Unlock()
	for _, t := range done {
		t.lost()
	}
	r.checkEvents()

	r.checkObject(s)
	r.checkStored(s)
	// Waiters leave the queue when they acquire or time out (or the
	// controller drops them past their deadline): nothing stays queued.
	Eventually(func() int { return len(r.get().Status.Waiters) }, 10*time.Second).Should(BeZero(), r.msg("waiters stay queued"))
}

// checkEvents runs test/history's checkers of I1, I2 and I6 (the fault
// suite's) over everything recorded so far.
func (r *modelRun) checkEvents() {
	r.mu.Lock()
	evs := slices.Clone(r.events)
	r.mu.Unlock()
	hs := history.Holdings(evs)
	vs := history.CheckHoldings(hs)
	vs = append(vs, history.CheckRequestIDs(evs)...)
	vs = append(vs, history.CheckStored(evs, hs)...)
	if r.typ == locksv1alpha1.Semaphore {
		vs = append(vs, history.CheckPermits(hs, map[string]int{modelKey: r.limit})...)
	}
	Expect(vs).To(BeEmpty(), r.msg("I1, I2 or I6 broken"))
}

// checkObject checks the invariants of one stored object: its holdings fit
// its type (a Mutex's one holder, an RWMutex's writer or readers, never
// both, a Semaphore's permits on distinct slots in range), holderCount and
// the Held condition count them, and status.fencingToken is the latest token
// issued: no holding has a higher one, and with one exclusive holding at a
// time it is the current or most recent holding's.
func (r *modelRun) checkObject(s *locksv1alpha1.DistributedLock) {
	st := &s.Status
	hs := holdings(s)
	r.mu.Lock()
	r.mostHeld = max(r.mostHeld, len(hs))
	r.mu.Unlock()
	switch r.typ {
	case locksv1alpha1.Mutex:
		Expect(st.SharedHolders).To(BeEmpty(), r.msg("a Mutex with shared holders"))
	case locksv1alpha1.RWMutex:
		Expect(st.Holder != nil && len(st.SharedHolders) > 0).To(BeFalse(), r.msg("an RWMutex with a writer and %d readers", len(st.SharedHolders)))
	case locksv1alpha1.Semaphore:
		Expect(st.Holder).To(BeNil(), r.msg("a Semaphore with an exclusive holder"))
		Expect(len(st.SharedHolders)).To(BeNumerically("<=", r.limit), r.msg("more holders than permits"))
	}
	slots := map[int32]string{}
	for _, h := range st.SharedHolders {
		Expect(h.Slot).To(BeNumerically("<", r.limit), r.msg("holding %s on slot %d, outside [0, %d)", h.LeaseID, h.Slot, r.limit))
		Expect(slots).NotTo(HaveKey(h.Slot), r.msg("holdings %s and %s on slot %d", slots[h.Slot], h.LeaseID, h.Slot))
		slots[h.Slot] = h.LeaseID
	}
	Expect(st.HolderCount).To(Equal(int32(len(hs))), r.msg("holderCount %d with %d holdings", st.HolderCount, len(hs)))
	held := meta.IsStatusConditionTrue(st.Conditions, locksv1alpha1.ConditionHeld)
	Expect(held).To(Equal(len(hs) > 0), r.msg("the Held condition is %v with %d holdings", held, len(hs)))
	for _, h := range hs {
		Expect(h.token).To(BeNumerically("<=", st.FencingToken), r.msg("holding %s has token %d above status.fencingToken %d", h.LeaseID, h.token, st.FencingToken))
	}
	for _, f := range st.RecentAcquisitions {
		Expect(f.FencingToken).To(BeNumerically("<=", st.FencingToken), r.msg("ended holding %s has token %d above status.fencingToken %d", f.LeaseID, f.FencingToken, st.FencingToken))
	}
	if recent := st.RecentAcquisitions; r.typ == locksv1alpha1.Mutex && st.Holder == nil && len(recent) > 0 {
		Expect(st.FencingToken).To(Equal(recent[len(recent)-1].FencingToken), r.msg("status.fencingToken is not the token of the most recent holding"))
	}
}

// checkStored accounts for every holding the stored object s shows, which the
// model test, reading after every step, sees all of: each is a client's
// acquisition or a timed-out acquire's whose write committed after all (a
// phantom), each acquisition shows up, status.transitions counts each once,
// and the holder is written as its client's user.
func (r *modelRun) checkStored(s *locksv1alpha1.DistributedLock) {
	st := &s.Status
	r.mu.Lock()
	defer r.mu.Unlock()
	type holding struct{ lease, req string }
	var seen []holding
	for _, f := range st.RecentAcquisitions {
		seen = append(seen, holding{f.LeaseID, f.RequestID})
		if !r.ended[f.LeaseID] {
			r.ended[f.LeaseID] = true
			if f.EndReason == locksv1alpha1.EndReasonExpired {
				r.expiries++
			}
		}
	}
	for _, h := range holdings(s) {
		seen = append(seen, holding{h.LeaseID, h.RequestID})
		owner, ok := r.reqOwner[h.RequestID]
		Expect(ok).To(BeTrue(), r.msg("unknown request %s holds the lock", h.RequestID))
		Expect(h.User).To(Equal(r.clients[owner].user), r.msg("holding %s written as user %s, its client is %s", h.LeaseID, h.User, r.clients[owner].user))
		Expect(h.shared).To(Equal(r.shared[h.RequestID]), r.msg("holding %s of request %s is shared: %v, its acquire asked for shared: %v", h.LeaseID, h.RequestID, h.shared, r.shared[h.RequestID]))
	}
	for _, h := range seen {
		if r.stored[h.lease] {
			continue
		}
		r.stored[h.lease] = true
		a, ok := r.acqs[h.req]
		switch {
		case ok && a.lease == h.lease:
		case !ok && r.failed[h.req]:
			// A timed-out Acquire whose write committed after all; nobody
			// renews it and the controller expires it.
			r.phantoms++
		default:
			Fail(r.msg("the stored lock has holding %s (request %s) that no client acquired", h.lease, h.req))
		}
	}
	for req, a := range r.acqs {
		Expect(r.stored).To(HaveKey(a.lease), r.msg("client %d acquired lease %s (request %s) but the stored lock never showed it", a.client, a.lease, req))
	}
	// Every acquisition counted once; retries add none.
	Expect(st.Transitions).To(Equal(int64(len(r.stored))), r.msg("status.transitions is %d, the stored history has %d distinct holdings", st.Transitions, len(r.stored)))
	Expect(r.stored).To(HaveLen(len(r.acqs)+r.phantoms), r.msg("stored holdings vs client acquisitions"))
	r.last = s
}

// drain releases what is held, waits for crashed holdings to expire and checks once more.
func (r *modelRun) drain() {
	r.rounds++
	for _, c := range r.clients {
		if h := c.cur; h != nil {
			if h.l.Err() == nil {
				r.release(c, h)
				continue
			}
			if h.manual {
				close(h.stop)
				<-h.stopped
			}
			c.cur = nil
		}
	}
	r.checkStep()
	for _, h := range holdings(r.last) {
		// A crashed holding: its handle runs out first, then the controller expires it.
		r.mu.Lock()
		var handles []*lock.Lock
		for _, t := range r.handles {
			if t.l.LeaseID() == h.LeaseID {
				handles = append(handles, t.l)
			}
		}
		r.mu.Unlock()
		for _, l := range handles {
			Eventually(l.Done(), 10*time.Second).Should(BeClosed(), r.msg("handle of crashed lease %s never ran out", h.LeaseID))
		}
		r.rounds++
		r.awaitExpiry(h.LeaseID)
		r.checkStep()
	}
	Expect(holdings(r.last)).To(BeEmpty(), r.msg("the lock is still held after the drain"))
}

// checkLinearizable checks the whole history against the sequential model.
func (r *modelRun) checkLinearizable() {
	r.mu.Lock()
	ops := slices.Clone(r.ops)
	r.mu.Unlock()
	model := history.Model()
	began := time.Now()
	res, info := porcupine.CheckOperationsVerbose(model, ops, 2*time.Minute)
	GinkgoWriter.Printf("porcupine: %s for %d operations in %s\n", res, len(ops), time.Since(began).Round(time.Millisecond))
	if res == porcupine.Ok && os.Getenv("KUBELOCK_MODEL_VISUALIZE") == "" {
		return
	}
	f, err := os.CreateTemp("", "kubelock-model-*.html")
	Expect(err).NotTo(HaveOccurred())
	Expect(porcupine.Visualize(model, info, f)).To(Succeed())
	Expect(f.Close()).To(Succeed())
	GinkgoWriter.Printf("porcupine visualization: %s\n", f.Name())
	Expect(res).To(Equal(porcupine.Ok), r.msg("the history is not linearizable; visualization in %s", f.Name()))
}

// dumpHistory writes the recorded operations, in call order, and the stored
// lock to a temporary file for a failure's report.
func (r *modelRun) dumpHistory() {
	r.mu.Lock()
	ops := slices.Clone(r.ops)
	r.mu.Unlock()
	sort.Slice(ops, func(i, j int) bool { return ops[i].Call < ops[j].Call })
	var b strings.Builder
	fmt.Fprintf(&b, "%s model seed %d, %d operations\n", r.typ, r.seed, len(ops))
	for _, op := range ops {
		fmt.Fprintf(&b, "%10.3f %10.3f  c%d  %s\n", float64(op.Call)/1e6, float64(op.Return)/1e6, op.ClientId, history.Describe(op.Input, op.Output))
	}
	l := &locksv1alpha1.DistributedLock{}
	if err := env.Client.Get(r.ctx, clientKey(r.ns), l); err == nil {
		fmt.Fprintf(&b, "\nstored status: %+v\n", l.Status)
	}
	f, err := os.CreateTemp("", "kubelock-model-history-*.txt")
	if err != nil {
		return
	}
	_, _ = f.WriteString(b.String())
	_ = f.Close()
	GinkgoWriter.Printf("model history (seed %d): %s\n", r.seed, f.Name())
	AddReportEntry("model history", f.Name())
}
