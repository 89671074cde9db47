package integration

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/resourceversion"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/faultproxy"
	"github.com/kubelock/kubelock/test/suite"
)

var _ = backends.Describe("acquire, renew, release", func() {
	ctx := context.Background()
	var ns string
	suite.NamespaceEach(&ns, "orders")

	It("gives the token old resourceVersion + 1 and writes the caller's user", func() {
		c, user := suite.NewClient(ctx, ns)
		before := suite.GetLock(ctx, ns, "orders")
		l, err := c.Acquire(ctx, "orders")
		Expect(err).NotTo(HaveOccurred())
		want, err := locksv1alpha1.NextFencingToken(before.ResourceVersion)
		Expect(err).NotTo(HaveOccurred())
		Expect(l.FencingToken()).To(Equal(want))

		stored := suite.GetLock(ctx, ns, "orders")
		Expect(stored.Status.Holder).NotTo(BeNil())
		Expect(stored.Status.Holder.User).To(Equal(user))
		Expect(stored.Status.Holder.LeaseID).To(Equal(l.LeaseID()))
		Expect(stored.Status.FencingToken).To(Equal(want))
		Expect(stored.Status.Transitions).To(Equal(int64(1)))
		Expect(stored.Spec.LeaseDurationSeconds).To(Equal(int32(30)))
		Expect(meta.IsStatusConditionTrue(stored.Status.Conditions, locksv1alpha1.ConditionHeld)).To(BeTrue())
		Expect(l.ExpiresAt()).To(BeTemporally("<=", time.Now().Add(30*time.Second)))
		Expect(l.Err()).NotTo(HaveOccurred())
		Expect(l.Release(ctx)).To(Succeed())
	})

	It("sends its status writes without managedFields; the stored ones are kept, its own entry added", func() {
		cfg, user := suite.UserConfig(ctx)
		var mu sync.Mutex
		var sent []map[string]any
		cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
			return roundTripFunc(func(req *http.Request) (*http.Response, error) {
				if req.Method == http.MethodPut && strings.HasSuffix(req.URL.Path, "/status") && req.GetBody != nil {
					body, err := req.GetBody()
					Expect(err).NotTo(HaveOccurred())
					var obj map[string]any
					Expect(json.NewDecoder(body).Decode(&obj)).To(Succeed())
					mu.Lock()
					sent = append(sent, obj)
					mu.Unlock()
				}
				return rt.RoundTrip(req)
			})
		})
		c, err := lock.New(cfg, lock.WithNamespace(ns), lock.WithIdentity(user), lock.WithoutAutoRenew())
		Expect(err).NotTo(HaveOccurred())
		before := suite.GetLock(ctx, ns, "orders").ManagedFields
		Expect(before).NotTo(BeEmpty(), "the lock's creation recorded a manager")
		l, err := c.Acquire(ctx, "orders")
		Expect(err).NotTo(HaveOccurred())
		Expect(l.Renew(ctx)).To(Succeed())
		Expect(l.Release(ctx)).To(Succeed())

		mu.Lock()
		defer mu.Unlock()
		Expect(len(sent)).To(BeNumerically(">=", 3), "the acquisition, the renewal and the release")
		for _, obj := range sent {
			Expect(obj).To(HaveKey("metadata"))
			Expect(obj["metadata"]).NotTo(HaveKey("managedFields"))
		}
		after := suite.GetLock(ctx, ns, "orders").ManagedFields
		for _, m := range before {
			Expect(after).To(ContainElement(And(
				HaveField("Manager", m.Manager), HaveField("Operation", m.Operation), HaveField("Subresource", m.Subresource),
			)), "the stored entry of %s (%s %q) was lost", m.Manager, m.Operation, m.Subresource)
		}
		Expect(after).To(ContainElement(And(HaveField("Subresource", "status"), HaveField("Operation", metav1.ManagedFieldsOperationUpdate))),
			"the lock user's status writes are recorded")
	})

	It("renews by advancing renewTime and keeps the deadline ahead", func() {
		c, _ := suite.NewClient(ctx, ns, lock.WithoutAutoRenew())
		l, err := c.Acquire(ctx, "orders")
		Expect(err).NotTo(HaveOccurred())
		first := suite.GetLock(ctx, ns, "orders").Status.Holder.RenewTime
		deadline := l.ExpiresAt()
		Eventually(func() error { return l.Renew(ctx) }).Should(Succeed())
		stored := suite.GetLock(ctx, ns, "orders")
		Expect(stored.Status.Holder.RenewTime.Time).To(BeTemporally(">", first.Time))
		Expect(l.ExpiresAt()).To(BeTemporally(">", deadline))
		Expect(l.Release(ctx)).To(Succeed())
	})

	It("records a release in recentAcquisitions, ends the lock's context and is idempotent", func() {
		c, user := suite.NewClient(ctx, ns)
		l, err := c.Acquire(ctx, "orders")
		Expect(err).NotTo(HaveOccurred())
		Expect(l.Release(ctx)).To(Succeed())
		Expect(l.Done()).To(BeClosed())
		Expect(context.Cause(l.Context())).To(MatchError(lock.ErrReleased))
		Expect(l.Release(ctx)).To(Succeed())

		stored := suite.GetLock(ctx, ns, "orders")
		Expect(stored.Status.Holder).To(BeNil())
		Expect(stored.Status.RecentAcquisitions).To(HaveLen(1))
		f := stored.Status.RecentAcquisitions[0]
		Expect(f.LeaseID).To(Equal(l.LeaseID()))
		Expect(f.FencingToken).To(Equal(l.FencingToken()))
		Expect(f.EndReason).To(Equal(locksv1alpha1.EndReasonReleased))
		Expect(f.EndedBy).To(Equal(user))
		Expect(meta.IsStatusConditionFalse(stored.Status.Conditions, locksv1alpha1.ConditionHeld)).To(BeTrue())
	})

	It("TryAcquire reports the holder with ErrLocked and never waits", func() {
		a, userA := suite.NewClient(ctx, ns)
		b, _ := suite.NewClient(ctx, ns)
		l, err := a.Acquire(ctx, "orders")
		Expect(err).NotTo(HaveOccurred())
		_, err = b.TryAcquire(ctx, "orders")
		Expect(err).To(MatchError(lock.ErrLocked))
		var locked *lock.LockedError
		Expect(errors.As(err, &locked)).To(BeTrue())
		Expect(locked.Holder.User).To(Equal(userA))
		Expect(suite.GetLock(ctx, ns, "orders").Status.Waiters).To(BeEmpty())
		Expect(l.Release(ctx)).To(Succeed())
		l2, err := b.TryAcquire(ctx, "orders")
		Expect(err).NotTo(HaveOccurred())
		Expect(l2.FencingToken()).To(BeNumerically(">", l.FencingToken()))
		Expect(l2.Release(ctx)).To(Succeed())
	})

	It("reports a missing lock with ErrNotFound and creates it on first use with WithAutoCreate", func() {
		c, _ := suite.NewClient(ctx, ns)
		_, err := c.Acquire(ctx, "no/such lock")
		Expect(err).To(MatchError(lock.ErrNotFound))

		auto, _ := suite.NewClient(ctx, ns, lock.WithAutoCreate())
		l, err := auto.Acquire(ctx, "no/such lock")
		Expect(err).NotTo(HaveOccurred())
		stored := suite.GetLock(ctx, ns, l.Name())
		Expect(stored.Labels).To(HaveKeyWithValue(locksv1alpha1.AutoCreatedLabel, "true"))
		Expect(stored.Annotations).To(HaveKeyWithValue(locksv1alpha1.KeyAnnotation, "no/such lock"))
		Expect(l.Release(ctx)).To(Succeed())
	})

	It("waits with a timeout, leaves the queue, and reports ErrTimeout wrapping DeadlineExceeded", func() {
		a, _ := suite.NewClient(ctx, ns)
		b, _ := suite.NewClient(ctx, ns)
		l, err := a.Acquire(ctx, "orders")
		Expect(err).NotTo(HaveOccurred())
		_, err = b.Acquire(ctx, "orders", lock.WithWaitTimeout(time.Second))
		Expect(err).To(MatchError(lock.ErrTimeout))
		Expect(errors.Is(err, context.DeadlineExceeded)).To(BeTrue())
		Expect(suite.GetLock(ctx, ns, "orders").Status.Waiters).To(BeEmpty())
		Expect(l.Release(ctx)).To(Succeed())
	})

	It("refuses to queue beyond spec.maxWaiters with ErrQueueFull", func() {
		suite.NewLock(ctx, ns, "tiny", locksv1alpha1.DistributedLockSpec{MaxWaiters: int32p(0)})
		a, _ := suite.NewClient(ctx, ns)
		b, _ := suite.NewClient(ctx, ns)
		l, err := a.Acquire(ctx, "tiny")
		Expect(err).NotTo(HaveOccurred())
		_, err = b.Acquire(ctx, "tiny", lock.WithWaitTimeout(5*time.Second))
		Expect(err).To(MatchError(lock.ErrQueueFull))
		Expect(l.Release(ctx)).To(Succeed())
	})

	It("hands the lock to waiters in FIFO order", func() {
		holder, _ := suite.NewClient(ctx, ns)
		first, err := holder.Acquire(ctx, "orders")
		Expect(err).NotTo(HaveOccurred())

		const n = 4
		order := make(chan int, n)
		var wg sync.WaitGroup
		DeferCleanup(wg.Wait)
		for i := range n {
			c, _ := suite.NewClient(ctx, ns)
			ctx := ctx
			wg.Add(1)
			go func() {
				defer GinkgoRecover()
				defer wg.Done()
				l, err := c.Acquire(ctx, "orders")
				Expect(err).NotTo(HaveOccurred())
				order <- i
				Expect(l.Release(ctx)).To(Succeed())
			}()
			// The next waiter starts only once this one is visibly queued.
			Eventually(func() int32 { return suite.GetLock(ctx, ns, "orders").Status.WaiterCount }).Should(Equal(int32(i + 1)))
		}
		Expect(first.Release(ctx)).To(Succeed())
		for i := range n {
			Eventually(order).Should(Receive(Equal(i)))
		}
	})

	It("shares one queue slot among goroutines of one process", func() {
		holder, _ := suite.NewClient(ctx, ns)
		l, err := holder.Acquire(ctx, "orders")
		Expect(err).NotTo(HaveOccurred())
		c, _ := suite.NewClient(ctx, ns)
		got := make(chan *lock.Lock, 3)
		ctx := ctx
		for range 3 {
			go func() {
				defer GinkgoRecover()
				l, err := c.Acquire(ctx, "orders")
				Expect(err).NotTo(HaveOccurred())
				got <- l
			}()
		}
		Eventually(func() int32 { return suite.GetLock(ctx, ns, "orders").Status.WaiterCount }).Should(Equal(int32(1)))
		Consistently(func() int32 { return suite.GetLock(ctx, ns, "orders").Status.WaiterCount }, time.Second).Should(Equal(int32(1)))
		Expect(l.Release(ctx)).To(Succeed())
		for range 3 {
			var next *lock.Lock
			Eventually(got).Should(Receive(&next))
			Expect(next.Release(ctx)).To(Succeed())
		}
	})

	It("keeps tokens increasing after the lock is deleted and created again", func() {
		c, _ := suite.NewClient(ctx, ns)
		l, err := c.Acquire(ctx, "orders")
		Expect(err).NotTo(HaveOccurred())
		Expect(l.Release(ctx)).To(Succeed())
		Expect(env.Client.Delete(ctx, suite.GetLock(ctx, ns, "orders"))).To(Succeed())
		Eventually(func() error {
			_, err := c.Get(ctx, "orders")
			return err
		}).Should(MatchError(lock.ErrNotFound))
		suite.NewLock(ctx, ns, "orders", locksv1alpha1.DistributedLockSpec{})
		l2, err := c.Acquire(ctx, "orders")
		Expect(err).NotTo(HaveOccurred())
		Expect(l2.FencingToken()).To(BeNumerically(">", l.FencingToken()))
		Expect(l2.Release(ctx)).To(Succeed())
	})

	It("compares resourceVersions of successive writes as increasing integers", func() {
		c, _ := suite.NewClient(ctx, ns)
		prev := suite.GetLock(ctx, ns, "orders").ResourceVersion
		for range 3 {
			l, err := c.Acquire(ctx, "orders")
			Expect(err).NotTo(HaveOccurred())
			Expect(l.Release(ctx)).To(Succeed())
			rv := suite.GetLock(ctx, ns, "orders").ResourceVersion
			cmp, err := resourceversion.CompareResourceVersion(rv, prev)
			Expect(err).NotTo(HaveOccurred())
			Expect(cmp).To(Equal(1))
			prev = rv
		}
	})
})

var _ = backends.Describe("idempotent acquire (I6)", func() {
	It("returns the same lease when the response to a committed acquire was lost", func() {
		ctx := context.Background()
		ns := suite.Namespace(ctx)
		suite.NewLock(ctx, ns, "orders", locksv1alpha1.DistributedLockSpec{})
		cfg, _ := suite.UserConfig(ctx)
		proxy, err := faultproxy.New(cfg)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(proxy.Close)

		// Drop the response to the first status write only.
		var armed = make(chan struct{}, 1)
		armed <- struct{}{}
		proxy.SetRule(func(r *http.Request) faultproxy.Action {
			if r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/status") {
				select {
				case <-armed:
					return faultproxy.DropResponse
				default:
				}
			}
			return faultproxy.Pass
		})
		c, err := lock.New(proxy.Config(), lock.WithNamespace(ns), lock.WithIdentity("retrier"))
		Expect(err).NotTo(HaveOccurred())
		l, err := c.Acquire(ctx, "orders", lock.WithRequestID("req-1"))
		Expect(err).NotTo(HaveOccurred())
		Expect(proxy.Dropped()).To(Equal(int64(1)))

		stored := suite.GetLock(ctx, ns, "orders")
		Expect(stored.Status.Transitions).To(Equal(int64(1)), "exactly one holding was created")
		Expect(stored.Status.Holder.RequestID).To(Equal("req-1"))
		Expect(stored.Status.Holder.LeaseID).To(Equal(l.LeaseID()))
		Expect(stored.Status.FencingToken).To(Equal(l.FencingToken()))

		// A retry of the same request while the lease lasts (here from a second
		// process of the same user) returns it again.
		c2, err := lock.New(proxy.Config(), lock.WithNamespace(ns), lock.WithIdentity("retrier"))
		Expect(err).NotTo(HaveOccurred())
		again, err := c2.Acquire(ctx, "orders", lock.WithRequestID("req-1"))
		Expect(err).NotTo(HaveOccurred())
		Expect(again.LeaseID()).To(Equal(l.LeaseID()))
		Expect(suite.GetLock(ctx, ns, "orders").Status.Transitions).To(Equal(int64(1)))

		// Once it ended, a retry says so instead of taking the lock again.
		Expect(l.Release(ctx)).To(Succeed())
		Expect(again.Renew(ctx)).To(MatchError(lock.ErrLockLost))
		Expect(again.Done()).To(BeClosed())
		_, err = c2.Acquire(ctx, "orders", lock.WithRequestID("req-1"))
		Expect(err).To(MatchError(lock.ErrLockLost))
		Expect(err.Error()).To(ContainSubstring("already ended: Released"))
		Expect(suite.GetLock(ctx, ns, "orders").Status.Transitions).To(Equal(int64(1)))
	})
})

var _ = backends.Describe("an acquire given up after its answer was lost", func() {
	// The acquiring write commits, its answer is lost, and the apiserver stays
	// out of reach until the caller gives up: the caller has no Lock to
	// release, so the call itself must end the holding its write made, or it
	// would block the lock until its lease ran out.
	DescribeTable("ends the holding its write made",
		func(ctx SpecContext, spec locksv1alpha1.DistributedLockSpec, opts ...lock.AcquireOption) {
			ns := suite.Namespace(ctx)
			suite.NewLock(ctx, ns, "orphan", spec)
			cfg, _ := suite.UserConfig(ctx)
			proxy, err := faultproxy.New(cfg)
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(proxy.Close)

			// The first status write's answer is dropped; every request after
			// it is refused until healed.
			healed := loseFirstWriteThenCutOff(proxy)
			c, err := lock.New(proxy.Config(), lock.WithNamespace(ns), lock.WithIdentity("quitter"))
			Expect(err).NotTo(HaveOccurred())

			callCtx, giveUp := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				_, err := c.Acquire(callCtx, "orphan", append(opts, lock.WithRequestID("req-1"))...)
				done <- err
			}()
			Eventually(func(g Gomega) {
				g.Expect(proxy.Dropped()).To(Equal(int64(1)))
				g.Expect(suite.GetLock(ctx, ns, "orphan").IsHeld()).To(BeTrue())
			}).Should(Succeed(), "the acquiring write did not commit")
			Consistently(done, 200*time.Millisecond).ShouldNot(Receive(), "the call ended while the apiserver was out of reach")

			giveUp()
			close(healed)
			Eventually(done).Should(Receive(MatchError(context.Canceled)))
			stored := suite.GetLock(ctx, ns, "orphan")
			Expect(stored.IsHeld()).To(BeFalse(), "the holding the call's write made is still there")
			Expect(stored.Status.Transitions).To(Equal(int64(1)))
			f := stored.Status.FindFinished("req-1")
			Expect(f).NotTo(BeNil())
			Expect(f.EndReason).To(Equal(locksv1alpha1.EndReasonReleased))
		},
		Entry("exclusive", locksv1alpha1.DistributedLockSpec{}),
		Entry("shared", locksv1alpha1.DistributedLockSpec{Type: locksv1alpha1.RWMutex}, lock.WithShared()),
	)
})

var _ = backends.Describe("idempotent acquire beyond what status remembers (I6)", func() {
	It("refuses to guess when the lock changed hands more often than recentAcquisitions records", func() {
		ctx := context.Background()
		ns := suite.Namespace(ctx)
		suite.NewLock(ctx, ns, "busy", locksv1alpha1.DistributedLockSpec{LeaseDurationSeconds: 1})
		cfg, _ := suite.UserConfig(ctx)
		proxy, err := faultproxy.New(cfg)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(proxy.Close)

		// The acquire commits but its answer is lost; then the client is cut
		// off while the lock changes hands nine times.
		healed := loseFirstWriteThenCutOff(proxy)
		c, err := lock.New(proxy.Config(), lock.WithNamespace(ns), lock.WithIdentity("cut-off"))
		Expect(err).NotTo(HaveOccurred())
		result := make(chan error, 1)
		go func() {
			defer GinkgoRecover()
			l, err := c.Acquire(ctx, "busy", lock.WithRequestID("req-lost"), lock.WithWaitTimeout(time.Minute))
			if err == nil {
				_ = l.Release(ctx)
			}
			result <- err
		}()
		Eventually(func() string {
			h := suite.GetLock(ctx, ns, "busy").Status.Holder
			if h == nil {
				return ""
			}
			return h.RequestID
		}).Should(Equal("req-lost"))

		other, _ := suite.NewClient(ctx, ns)
		for range locksv1alpha1.MaxRecentAcquisitions + 1 {
			l, err := other.Acquire(ctx, "busy", lock.WithWaitTimeout(time.Minute))
			Expect(err).NotTo(HaveOccurred())
			Expect(l.Release(ctx)).To(Succeed())
		}
		Expect(suite.GetLock(ctx, ns, "busy").Status.FindFinished("req-lost")).To(BeNil(), "the record aged out")
		transitions := suite.GetLock(ctx, ns, "busy").Status.Transitions

		close(healed)
		var got error
		Eventually(result, time.Minute).Should(Receive(&got))
		Expect(got).To(MatchError(lock.ErrLockLost))
		Expect(got.Error()).To(ContainSubstring("cannot tell whether request req-lost acquired"))
		Expect(suite.GetLock(ctx, ns, "busy").Status.Transitions).To(Equal(transitions), "no second holding")
	})
})

// loseFirstWriteThenCutOff makes proxy pass requests until the first status
// write, drop that write's answer (it commits, the client cannot know) and
// refuse every request after it until the returned channel is closed.
func loseFirstWriteThenCutOff(proxy *faultproxy.Proxy) (healed chan struct{}) {
	var dropped atomic.Bool
	healed = make(chan struct{})
	proxy.SetRule(func(r *http.Request) faultproxy.Action {
		select {
		case <-healed:
			return faultproxy.Pass
		default:
		}
		if r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/status") && dropped.CompareAndSwap(false, true) {
			return faultproxy.DropResponse
		}
		if dropped.Load() {
			return faultproxy.Refuse
		}
		return faultproxy.Pass
	})
	return healed
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
