package integration

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/faultproxy"
	"github.com/kubelock/kubelock/test/suite"
)

var _ = backends.Describe("sessions", func() {
	ctx := context.Background()
	var ns string
	suite.NamespaceEach(&ns)

	getSession := func(name string) *locksv1alpha1.LockSession {
		s := &locksv1alpha1.LockSession{}
		Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, s)).To(Succeed())
		return s
	}

	It("creates a session as its user, renews it every TTL/3 and deletes it on Close", func() {
		c, user := suite.NewClient(ctx, ns, lock.WithIdentity("Worker 7/a"))
		s, err := c.NewSession(ctx, lock.WithTTL(6*time.Second))
		Expect(err).NotTo(HaveOccurred())
		Expect(s.TTL()).To(Equal(6 * time.Second))
		stored := getSession(s.Name())
		Expect(stored.Spec.User).To(Equal(user))
		Expect(stored.Spec.Identity).To(Equal("Worker 7/a"))
		Expect(stored.Spec.TTLSeconds).To(BeEquivalentTo(6))
		Expect(stored.Spec.PodUID).To(BeEmpty(), "no pod fields without a pod-bound token")
		Expect(stored.OwnerReferences).To(BeEmpty())
		Expect(strings.HasPrefix(s.Name(), "worker-7-a-")).To(BeTrue(), "name %s is generated from the identity", s.Name())

		first := s.ExpiresAt()
		var renewed *locksv1alpha1.LockSession
		Eventually(func() bool {
			renewed = getSession(s.Name())
			return renewed.Status.RenewTime != nil
		}).WithTimeout(5 * time.Second).Should(BeTrue())
		Eventually(s.ExpiresAt).Should(BeTemporally(">", first), "a committed renewal moves the safe deadline")
		Consistently(s.Done(), 3*time.Second).ShouldNot(BeClosed())

		Expect(s.Close(ctx)).To(Succeed())
		Expect(s.Done()).To(BeClosed())
		Expect(s.Err()).To(MatchError(lock.ErrSessionClosed))
		Eventually(func() error {
			return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: s.Name()}, &locksv1alpha1.LockSession{})
		}).Should(MatchError(ContainSubstring("not found")))
		Expect(s.Close(ctx)).To(Succeed(), "Close is idempotent")
	})

	It("ends every lock's context on Close, and a closed session acquires nothing", func() {
		c, _ := suite.NewClient(ctx, ns, lock.WithAutoCreate())
		s, err := c.NewSession(ctx, lock.WithTTL(10*time.Second))
		Expect(err).NotTo(HaveOccurred())
		var locks []*lock.Lock
		for i := range 3 {
			l, err := c.TryAcquire(ctx, fmt.Sprintf("job-%d", i), lock.WithSession(s))
			Expect(err).NotTo(HaveOccurred())
			h := suite.GetLock(ctx, ns, l.Name()).Status.Holder
			Expect(h.Session).To(Equal(s.Name()))
			Expect(h.LeaseDurationSeconds).To(BeEquivalentTo(10), "a holding in a session carries its TTL")
			Expect(l.Renew(ctx)).To(Succeed(), "Renew renews nothing while the session lives")
			locks = append(locks, l)
		}
		Expect(s.Close(ctx)).To(Succeed())
		for _, l := range locks {
			Expect(l.Done()).To(BeClosed())
			Expect(l.Err()).To(MatchError(lock.ErrSessionClosed))
			Expect(l.Err()).To(MatchError(lock.ErrLockLost))
		}
		_, err = c.TryAcquire(ctx, "job-9", lock.WithSession(s))
		Expect(err).To(MatchError(lock.ErrSessionClosed))
		Expect(err.Error()).To(ContainSubstring("session " + s.Name()))
	})

	It("acquires in the client's session by default (WithSession) and queues in it; only its user's clients may use it", func() {
		cfg, _ := suite.UserConfig(ctx)
		c, err := lock.New(cfg, lock.WithNamespace(ns), lock.WithIdentity("owner"), lock.WithAutoCreate())
		Expect(err).NotTo(HaveOccurred())
		s, err := c.NewSession(ctx)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = s.Close(context.Background()) })
		Expect(s.TTL()).To(Equal(lock.DefaultSessionTTL))

		other, _ := suite.NewClient(ctx, ns, lock.WithAutoCreate())
		held, err := other.Acquire(ctx, "q")
		Expect(err).NotTo(HaveOccurred())
		_, err = other.TryAcquire(ctx, "r", lock.WithSession(s))
		Expect(err).To(MatchError(ContainSubstring("is user")), "a session is its user's only")

		cs, err := lock.New(cfg, lock.WithNamespace(ns), lock.WithIdentity("owner"), lock.WithSession(s))
		Expect(err).NotTo(HaveOccurred())
		got := make(chan *lock.Lock, 1)
		go func() {
			defer GinkgoRecover()
			l, err := cs.Acquire(ctx, "q", lock.WithWaitTimeout(20*time.Second))
			Expect(err).NotTo(HaveOccurred())
			got <- l
		}()
		Eventually(func() []locksv1alpha1.Waiter { return suite.GetLock(ctx, ns, "q").Status.Waiters }).Should(
			ContainElement(HaveField("Session", s.Name())))
		Expect(held.Release(ctx)).To(Succeed())
		var l *lock.Lock
		Eventually(got).Should(Receive(&l))
		Expect(suite.GetLock(ctx, ns, "q").Status.Holder.Session).To(Equal(s.Name()))
		Expect(l.Release(ctx)).To(Succeed())
	})

	It("writes one renewal per TTL/3 for 40 locks, where per-lock leases write 40 (apiserver_request_total)", func() {
		const n, ttl, window = 40, 15 * time.Second, 10 * time.Second
		for i := range n {
			suite.NewLock(ctx, ns, fmt.Sprintf("s-%d", i), locksv1alpha1.DistributedLockSpec{})
			suite.NewLock(ctx, ns, fmt.Sprintf("p-%d", i), locksv1alpha1.DistributedLockSpec{})
		}
		// hold acquires n locks with prefix, then counts the writes to sessions
		// and locks over window. The holdings are fresh, so none of them can
		// expire within the window, which is shorter than their lease.
		hold := func(c *lock.Client, prefix string, settled func(), opts ...lock.AcquireOption) (sessionWrites, lockWrites float64) {
			locks := make([]*lock.Lock, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					defer GinkgoRecover()
					l, err := c.TryAcquire(ctx, fmt.Sprintf("%s-%d", prefix, i), opts...)
					Expect(err).NotTo(HaveOccurred())
					locks[i] = l
				})
			}
			wg.Wait()
			settled()
			s0, l0 := renewWrites()
			time.Sleep(window) // the writes to count happen meanwhile, in the background
			s1, l1 := renewWrites()
			for _, l := range locks {
				Expect(l.Err()).NotTo(HaveOccurred())
				if h := suite.GetLock(ctx, ns, l.Name()).Status.Holder; h.Session != "" {
					Expect(h.RenewTime).To(Equal(&h.AcquireTime), "a holding in a session is never renewed itself")
				}
				Expect(l.Release(ctx)).To(Succeed())
			}
			return s1 - s0, l1 - l0
		}

		withSession, _ := suite.NewClient(ctx, ns)
		s, err := withSession.NewSession(ctx, lock.WithTTL(ttl))
		Expect(err).NotTo(HaveOccurred())
		// The controller counts the session's holdings (status.locks, a write of
		// its own): wait for it to count all of them before the window opens.
		counted := func() {
			Eventually(func() int32 { return getSession(s.Name()).Status.Locks }).Should(BeEquivalentTo(n))
		}
		sessionW, sessionLockW := hold(withSession, "s", counted, lock.WithSession(s))
		Expect(s.Close(ctx)).To(Succeed())

		perLock, _ := suite.NewClient(ctx, ns, lock.WithLeaseDuration(ttl))
		_, perLockW := hold(perLock, "p", func() {})

		// The counters are the whole apiserver's. The session client's only lock
		// writes are its acquires before the window and its releases after it
		// (its holdings' renewTime never moved), so the lock writes within its
		// window are others' (the controller expiring earlier specs' locks).
		intervals := window.Seconds() / (ttl / 3).Seconds()
		sessionRate := sessionW / window.Seconds()
		perLockRate := perLockW / window.Seconds()
		ratio := perLockRate / max(sessionRate, 1/window.Seconds())
		fmt.Fprintf(GinkgoWriter, "holding %d locks, lease/TTL %s, over %s (%.1f renewal intervals of TTL/3):\n", n, ttl, window, intervals)
		fmt.Fprintf(GinkgoWriter, "  sessions:         %3.0f session writes = %.2f writes/s (%.2f per TTL/3; %.0f writes to locks by others meanwhile)\n",
			sessionW, sessionRate, sessionW/intervals, sessionLockW)
		fmt.Fprintf(GinkgoWriter, "  per-lock leases:  %3.0f lock writes = %.2f writes/s (%.1f per TTL/3)\n", perLockW, perLockRate, perLockW/intervals)
		fmt.Fprintf(GinkgoWriter, "  ratio: %.0fx fewer writes with a session (goal >= 10x)\n", ratio)
		AddReportEntry("session renewal writes", fmt.Sprintf("sessions %.2f writes/s, per-lock leases %.2f writes/s, ratio %.0fx (goal >= 10x)", sessionRate, perLockRate, ratio))

		// One renewal per TTL/3 (jitter 0.9..1.08 of it), whatever the session holds.
		Expect(sessionW).To(BeNumerically("<=", intervals/0.9+1))
		Expect(sessionW).To(BeNumerically(">=", 1))
		Expect(perLockW).To(BeNumerically(">=", n*(intervals/1.08-1)))
		Expect(ratio).To(BeNumerically(">=", 10))
	})
})

// renewWrites scrapes apiserver_request_total of the server that serves the
// lock API and sums the PATCH and update (verb="PUT") requests to
// locksessions and to distributedlocks, any subresource and response code.
func renewWrites() (sessions, locks float64) {
	cs, err := kubernetes.NewForConfig(env.LockAPIConfig())
	Expect(err).NotTo(HaveOccurred())
	body, err := cs.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	Expect(err).NotTo(HaveOccurred())
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "apiserver_request_total{") ||
			!(strings.Contains(line, `verb="PATCH"`) || strings.Contains(line, `verb="PUT"`)) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		Expect(err).NotTo(HaveOccurred())
		switch {
		case strings.Contains(line, `resource="locksessions"`):
			sessions += v
		case strings.Contains(line, `resource="distributedlocks"`):
			locks += v
		}
	}
	Expect(sc.Err()).NotTo(HaveOccurred())
	return sessions, locks
}

// Needs the controller to know sessions (h-sctl): it ends the holdings of a
// lapsed session with SessionExpired.
var _ = backends.Describe("a session cut off from the apiserver (I5 per session)", Serial, func() {
	It("ends every lock's context before the controller ends any holding and another client takes it", func() {
		ctx := context.Background()
		ns := suite.Namespace(ctx)
		const ttl, n = 5 * time.Second, 3
		keys := make([]string, n)
		for i := range keys {
			keys[i] = fmt.Sprintf("cut-%d", i)
			suite.NewLock(ctx, ns, keys[i], locksv1alpha1.DistributedLockSpec{})
		}
		cfg, _ := suite.UserConfig(ctx)
		proxy, err := faultproxy.New(cfg)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(proxy.Close)
		a, err := lock.New(proxy.Config(), lock.WithNamespace(ns), lock.WithIdentity("cut-off"))
		Expect(err).NotTo(HaveOccurred())
		s, err := a.NewSession(ctx, lock.WithTTL(ttl))
		Expect(err).NotTo(HaveOccurred())
		held := make([]*lock.Lock, n)
		for i, k := range keys {
			held[i], err = a.TryAcquire(ctx, k, lock.WithSession(s))
			Expect(err).NotTo(HaveOccurred())
		}
		// The deadline the cut is measured against comes from a renewal, not the create.
		created := s.ExpiresAt()
		Eventually(s.ExpiresAt).WithTimeout(2*ttl).Should(BeTemporally(">", created), "a renewal lands before the cut")

		proxy.SetRule(func(*http.Request) faultproxy.Action { return faultproxy.Refuse })
		cutAt := time.Now()
		b, _ := suite.NewClient(ctx, ns)
		type grant struct {
			at   time.Time
			lock *lock.Lock
		}
		granted := make(chan grant, n)
		for _, k := range keys {
			go func() {
				defer GinkgoRecover()
				next, err := b.Acquire(ctx, k, lock.WithWaitTimeout(time.Minute))
				Expect(err).NotTo(HaveOccurred())
				granted <- grant{time.Now(), next}
			}()
		}
		Eventually(s.Done(), 2*ttl).Should(BeClosed())
		doneAt := time.Now()
		Expect(doneAt.Sub(cutAt)).To(BeNumerically("<", ttl))
		for _, l := range held {
			Expect(l.Done()).To(BeClosed(), "a lock's context ends with its session's")
			Expect(l.Err()).To(MatchError(lock.ErrLockLost))
		}
		for range n {
			var g grant
			Eventually(granted, 4*ttl).Should(Receive(&g))
			Expect(doneAt.Before(g.at)).To(BeTrue(), "every lock ended (%s) before %s was taken again (%s)", doneAt, g.lock.Name(), g.at)
			for i, l := range held {
				if l.Name() != g.lock.Name() {
					continue
				}
				Expect(g.lock.FencingToken()).To(BeNumerically(">", held[i].FencingToken()))
				ended := suite.GetLock(ctx, ns, l.Name()).Status.RecentAcquisitions
				Expect(ended[len(ended)-1].EndReason).To(Equal(locksv1alpha1.EndReasonSessionExpired))
			}
			Expect(g.lock.Release(ctx)).To(Succeed())
		}
		proxy.SetRule(nil)
		Expect(held[0].Release(ctx)).To(MatchError(lock.ErrLockLost))
		Expect(s.Close(ctx)).To(Succeed())
	})
})
