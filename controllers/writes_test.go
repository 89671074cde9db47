package controllers_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/controllers"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/testmetrics"
)

// The budget of docs/design.md "Performance notes": one apiserver write per
// lock operation, none added by the operator, and one round trip when
// nothing contends.
var _ = Describe("apiserver writes per lock operation", func() {
	It("is one status write per acquire, renew and release, none by the controller, no Event, and one request each after the first read", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		// Earlier specs' stopped controllers leave what was still queued in the
		// process-wide depth gauge: this controller is idle at that value.
		idleDepth := lockControllerMetric("workqueue_depth")
		settle := func() func() { return settleAt(idleDepth) }
		// Only this namespace: the controller then writes nothing for earlier
		// specs' locks, and every lock write the apiserver counts is this spec's.
		startController(controllers.WithNamespaces(ns))
		settled := settle()
		key := createLock(ctx, ns, "writes", nil, locksv1alpha1.DistributedLockSpec{LeaseDurationSeconds: 30})
		settled()

		requests := &requestCounter{}
		cfg := rest.CopyConfig(env.Config)
		cfg.Wrap(requests.wrap)
		c, err := lock.New(cfg, lock.WithNamespace(ns), lock.WithIdentity("writer"), lock.WithoutAutoRenew())
		Expect(err).NotTo(HaveOccurred())
		_, err = c.User(ctx) // the SelfSubjectReview, once per client, before counting
		Expect(err).NotTo(HaveOccurred())

		// measure runs op with the controller settled before and after, and
		// returns the apiserver's writes meanwhile and the client's requests.
		measure := func(name string, op func()) (w writes, r map[string]int) {
			before := apiserverWrites()
			requests.reset()
			settled := settle()
			op()
			settled()
			after := apiserverWrites()
			w = writes{status: after.status - before.status, events: after.events - before.events}
			r = requests.get()
			fmt.Fprintf(GinkgoWriter, "%-8s status writes %v, event writes %v, client requests %v\n", name, w.status, w.events, r)
			return w, r
		}
		const rounds = 3
		for i := range rounds {
			var l *lock.Lock
			acq, acqReqs := measure("acquire", func() {
				var err error
				l, err = c.TryAcquire(ctx, key.Name)
				Expect(err).NotTo(HaveOccurred())
			})
			ren, renReqs := measure("renew", func() { Expect(l.Renew(ctx)).To(Succeed()) })
			rel, relReqs := measure("release", func() { Expect(l.Release(ctx)).To(Succeed()) })
			for op, w := range map[string]writes{"acquire": acq, "renew": ren, "release": rel} {
				Expect(w).To(Equal(writes{status: 1}), "round %d: %s: apiserver writes (one status write, no Event)", i, op)
			}
			// One round trip: the first acquire of a lock this client never saw
			// reads it once; later ones start from the release's response.
			wantAcquire := map[string]int{"PUT status": 1}
			if i == 0 {
				wantAcquire["GET lock"] = 1
			}
			Expect(acqReqs).To(Equal(wantAcquire), "round %d: the client's requests per acquire", i)
			Expect(renReqs).To(Equal(map[string]int{"PUT status": 1}), "round %d: the client's requests per renew", i)
			Expect(relReqs).To(Equal(map[string]int{"PUT status": 1}), "round %d: the client's requests per release", i)
		}
		Expect(getLock(ctx, key).Status.Transitions).To(BeEquivalentTo(rounds))
	})
})

var _ = Describe("an acquire starting from the object seen last", func() {
	It("reads afresh when that object is stale, and never answers Locked or acquires from it", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		key := createLock(ctx, ns, "stale", nil, locksv1alpha1.DistributedLockSpec{LeaseDurationSeconds: 30})
		requests := &requestCounter{}
		cfg := rest.CopyConfig(env.Config)
		cfg.Wrap(requests.wrap)
		a, err := lock.New(cfg, lock.WithNamespace(ns), lock.WithIdentity("a"), lock.WithoutAutoRenew())
		Expect(err).NotTo(HaveOccurred())
		b, err := lock.New(env.Config, lock.WithNamespace(ns), lock.WithIdentity("b"), lock.WithoutAutoRenew())
		Expect(err).NotTo(HaveOccurred())

		la, err := a.TryAcquire(ctx, key.Name)
		Expect(err).NotTo(HaveOccurred())
		Expect(la.Release(ctx)).To(Succeed()) // a now remembers the lock free
		lb, err := b.TryAcquire(ctx, key.Name)
		Expect(err).NotTo(HaveOccurred())

		By("trying on the stale free object: a conflict, a fresh read, then Locked")
		requests.reset()
		_, err = a.TryAcquire(ctx, key.Name)
		Expect(err).To(MatchError(lock.ErrLocked))
		Expect(requests.get()).To(Equal(map[string]int{"PUT status": 1, "GET lock": 1}))
		Expect(getLock(ctx, key).Status.Holder.Identity).To(Equal("b"))

		By("reading afresh when the object seen last is held, instead of answering Locked from it")
		Expect(lb.Release(ctx)).To(Succeed())
		requests.reset()
		la, err = a.TryAcquire(ctx, key.Name)
		Expect(err).NotTo(HaveOccurred())
		Expect(requests.get()).To(Equal(map[string]int{"GET lock": 1, "PUT status": 1}))
		Expect(la.FencingToken()).To(BeNumerically(">", lb.FencingToken()))
		Expect(la.Release(ctx)).To(Succeed())
	})
})

var _ = Describe("a holding whose acquire waited", func() {
	It("follows its lock: renewing and releasing after others joined or left the queue sends no read", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		key := createLock(ctx, ns, "followed", nil, locksv1alpha1.DistributedLockSpec{LeaseDurationSeconds: 30})
		client := func(name string, cfg *rest.Config) *lock.Client {
			c, err := lock.New(cfg, lock.WithNamespace(ns), lock.WithIdentity(name), lock.WithoutAutoRenew())
			Expect(err).NotTo(HaveOccurred())
			return c
		}
		requests := &requestCounter{}
		cfg := rest.CopyConfig(env.Config)
		cfg.Wrap(requests.wrap)
		cfg.Wrap((&watchGate{key: key}).wrap)
		first, follower, joiner := client("first", env.Config), client("follower", cfg), client("joiner", env.Config)
		queued := func(n int) {
			GinkgoHelper()
			Eventually(func() []locksv1alpha1.Waiter { return getLock(ctx, key).Status.Waiters }).Should(HaveLen(n))
		}
		acquire := func(c *lock.Client) <-chan *lock.Lock {
			got := make(chan *lock.Lock, 1)
			go func() {
				defer GinkgoRecover()
				l, err := c.Acquire(ctx, key.Name)
				Expect(err).NotTo(HaveOccurred())
				got <- l
			}()
			return got
		}

		lf, err := first.TryAcquire(ctx, key.Name)
		Expect(err).NotTo(HaveOccurred())
		followed := acquire(follower)
		queued(1)
		Expect(lf.Release(ctx)).To(Succeed())
		var l *lock.Lock
		Eventually(followed).Should(Receive(&l))

		// Each write below is based on a version older than the lock's: the
		// follower either saw the newer one on its watch before writing, or
		// meets a conflict and takes it from the watch; it never reads.
		noRead := func(what string) {
			GinkgoHelper()
			r := requests.get()
			fmt.Fprintf(GinkgoWriter, "%s: client requests %v\n", what, r)
			Expect(r).NotTo(HaveKey("GET lock"), what)
			Expect(r).NotTo(HaveKey("WATCH lock"), what)
			Expect(r["PUT status"]).To(BeNumerically(">=", 1), what)
			Expect(r["PUT status"]).To(BeNumerically("<=", 2), what)
		}
		joined := acquire(joiner)
		queued(1)
		requests.reset()
		Expect(l.Renew(ctx)).To(Succeed())
		noRead("renew after a waiter joined")

		By("the joiner leaving the queue and joining again")
		jl := getLock(ctx, key)
		Expect(jl.Status.RemoveWaiter(jl.Status.Waiters[0].RequestID)).To(BeTrue())
		Expect(env.Client.Status().Update(ctx, jl)).To(Succeed())
		queued(1) // the joiner's watch sees it left and it joins again
		requests.reset()
		Expect(l.Release(ctx)).To(Succeed())
		noRead("release after the queue changed")
		var lj *lock.Lock
		Eventually(joined).Should(Receive(&lj))
		Expect(lj.FencingToken()).To(BeNumerically(">", l.FencingToken()))
		Expect(lj.Release(ctx)).To(Succeed())
	})
})

var _ = Describe("a waiter whose acquiring write meets a conflict", func() {
	It("takes the version that won from its watch instead of reading the lock", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		key := createLock(ctx, ns, "raced", nil, locksv1alpha1.DistributedLockSpec{LeaseDurationSeconds: 30})
		holder, err := lock.New(env.Config, lock.WithNamespace(ns), lock.WithIdentity("holder"), lock.WithoutAutoRenew())
		Expect(err).NotTo(HaveOccurred())
		lh, err := holder.TryAcquire(ctx, key.Name)
		Expect(err).NotTo(HaveOccurred())

		// Once armed, the waiter's next status write waits until another
		// waiter's entry is written: that write wins, the waiter's meets a 409.
		requests := &requestCounter{}
		var armed atomic.Bool
		cfg := rest.CopyConfig(env.Config)
		cfg.Wrap(requests.wrap)
		cfg.Wrap((&watchGate{key: key}).wrap)
		cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
			return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
				if r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/status") && armed.CompareAndSwap(true, false) {
					l := getLock(ctx, key)
					now := metav1.NowMicro()
					l.Status.AppendWaiter(locksv1alpha1.Waiter{Identity: "joiner", User: whoAmI(), RequestID: "joiner-request",
						EnqueueTime: now, Deadline: metav1.NewMicroTime(now.Add(time.Minute))})
					Expect(env.Client.Status().Update(ctx, l)).To(Succeed())
				}
				return rt.RoundTrip(r)
			})
		})
		waiter, err := lock.New(cfg, lock.WithNamespace(ns), lock.WithIdentity("waiter"), lock.WithoutAutoRenew())
		Expect(err).NotTo(HaveOccurred())
		got := make(chan *lock.Lock, 1)
		go func() {
			defer GinkgoRecover()
			l, err := waiter.Acquire(ctx, key.Name)
			Expect(err).NotTo(HaveOccurred())
			got <- l
		}()
		Eventually(func() []locksv1alpha1.Waiter { return getLock(ctx, key).Status.Waiters }).Should(HaveLen(1))
		// Its entry is written before it opens its watch: count from then on.
		Eventually(func() map[string]int { return requests.get() }).Should(HaveKeyWithValue("WATCH lock", 1))
		requests.reset()
		armed.Store(true)
		Expect(lh.Release(ctx)).To(Succeed())
		var lw *lock.Lock
		Eventually(got).Should(Receive(&lw))
		r := requests.get()
		fmt.Fprintf(GinkgoWriter, "take with a conflict: client requests %v\n", r)
		Expect(armed.Load()).To(BeFalse(), "the waiter's write met the joiner's")
		Expect(r).To(Equal(map[string]int{"PUT status": 2}), "a 409, then the take on the version from the watch; no read")
		st := getLock(ctx, key).Status
		Expect(st.Holder.Identity).To(Equal("waiter"))
		Expect(st.Waiters).To(HaveLen(1)) // the joiner, still queued
		Expect(lw.FencingToken()).To(BeNumerically(">", lh.FencingToken()))
		Expect(lw.Release(ctx)).To(Succeed())
	})
})

// writes are apiserver write requests: to distributedlocks/status, and of Events.
type writes struct{ status, events float64 }

// apiserverWrites scrapes the apiserver's apiserver_request_total: PUT and
// PATCH of distributedlocks/status, POST and PATCH of events, any code.
func apiserverWrites() writes {
	cs, err := kubernetes.NewForConfig(env.Config)
	Expect(err).NotTo(HaveOccurred())
	body, err := cs.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	Expect(err).NotTo(HaveOccurred())
	var w writes
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		Expect(err).NotTo(HaveOccurred())
		switch {
		case strings.Contains(line, `resource="distributedlocks"`) && strings.Contains(line, `subresource="status"`) &&
			(strings.Contains(line, `verb="PUT"`) || strings.Contains(line, `verb="PATCH"`)):
			w.status += v
		case strings.Contains(line, `resource="events"`) && (strings.Contains(line, `verb="POST"`) || strings.Contains(line, `verb="PATCH"`)):
			w.events += v
		}
	}
	Expect(sc.Err()).NotTo(HaveOccurred())
	return w
}

// lockControllerMetric is the lock controller's value of a controller-runtime metric.
func lockControllerMetric(name string) float64 {
	v, err := testmetrics.Value(ctrlmetrics.Registry, name, map[string]string{"controller": controllers.ControllerName})
	Expect(err).NotTo(HaveOccurred())
	return v
}

// settleAt, called before a write, returns a function that waits until the
// lock controller has reconciled since and is idle (queue depth back at
// idleDepth, no worker running): its reconcile of the write has finished, and
// with it any write of its own, which the apiserver counted before the
// reconcile returned.
func settleAt(idleDepth float64) func() {
	before := lockControllerMetric("controller_runtime_reconcile_total")
	return func() {
		EventuallyWithOffset(1, func(g Gomega) {
			g.Expect(lockControllerMetric("controller_runtime_reconcile_total")).To(BeNumerically(">", before), "reconciles")
			g.Expect(lockControllerMetric("workqueue_depth")).To(Equal(idleDepth), "queued")
			g.Expect(lockControllerMetric("controller_runtime_active_workers")).To(BeZero(), "running")
		}).Should(Succeed())
	}
}

// watchGate holds a client's 409 on a status write of the lock key until the
// client's own watch of it has carried the version that won. The specs that
// prove a client takes that version from its watch instead of reading the
// lock must not depend on how fast a busy machine delivers watch events:
// pkg/lock waits followWait (250 ms) for the event after a conflict, and
// reads when it is later, which is right, but not what those specs test.
// With the gate, that wait covers only decoding an event already received.
type watchGate struct {
	key  client.ObjectKey
	mu   sync.Mutex
	seen map[string]bool // resourceVersions the client's watches carried
}

var resourceVersionField = regexp.MustCompile(`"resourceVersion":"([0-9]+)"`)

func (g *watchGate) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(r)
		switch {
		case err != nil:
		case r.Method == http.MethodGet && r.URL.Query().Get("watch") == "true":
			resp.Body = &watchBody{ReadCloser: resp.Body, g: g}
		case r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/"+g.key.Name+"/status") && resp.StatusCode == http.StatusConflict:
			won := getLock(r.Context(), g.key).ResourceVersion
			Eventually(func() bool {
				g.mu.Lock()
				defer g.mu.Unlock()
				return g.seen[won]
			}).WithTimeout(30*time.Second).Should(BeTrue(), "the client's watch carried version %s, which won", won)
		}
		return resp, err
	})
}

// watchBody records the resourceVersions of the watch events it carries
// (the JSON stream has one event per line).
type watchBody struct {
	io.ReadCloser
	g    *watchGate
	line []byte
}

func (b *watchBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.line = append(b.line, p[:n]...)
	for {
		i := bytes.IndexByte(b.line, '\n')
		if i < 0 {
			break
		}
		if m := resourceVersionField.FindSubmatch(b.line[:i]); m != nil {
			b.g.mu.Lock()
			if b.g.seen == nil {
				b.g.seen = map[string]bool{}
			}
			b.g.seen[string(m[1])] = true
			b.g.mu.Unlock()
		}
		b.line = b.line[i+1:]
	}
	return n, err
}

// requestCounter counts a client's requests by method (WATCH for a watch)
// and resource kind.
type requestCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *requestCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		what := r.Method
		if r.URL.Query().Get("watch") == "true" {
			what = "WATCH"
		}
		switch {
		case strings.Contains(r.URL.Path, "/distributedlocks/") && strings.HasSuffix(r.URL.Path, "/status"):
			what += " status"
		case strings.Contains(r.URL.Path, "/distributedlocks"):
			what += " lock"
		default:
			what += " " + r.URL.Path
		}
		c.mu.Lock()
		if c.n == nil {
			c.n = map[string]int{}
		}
		c.n[what]++
		c.mu.Unlock()
		return rt.RoundTrip(r)
	})
}

func (c *requestCounter) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n = nil
}

func (c *requestCounter) get() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.n))
	for k, v := range c.n {
		out[k] = v
	}
	return out
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
