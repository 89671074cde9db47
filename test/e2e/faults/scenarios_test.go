//go:build faults

package faults

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kubelock/kubelock/test/e2e/faults/wire"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/faultproxy"
	"github.com/kubelock/kubelock/test/history"
	"github.com/kubelock/kubelock/test/suite"
)

func getLock(ctx context.Context, key string) *locksv1alpha1.DistributedLock {
	l := &locksv1alpha1.DistributedLock{}
	Eventually(func() error {
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		return admin.Get(rctx, client.ObjectKey{Namespace: namespace, Name: key}, l)
	}).Should(Succeed())
	return l
}

// acquireOK acquires key with c and returns the reply, failing unless it succeeded.
func acquireOK(c *lockClient, key string, wait time.Duration) wire.Reply {
	r := c.do(wire.Command{Cmd: "acquire", Key: key, Wait: wait})
	ExpectWithOffset(1, r.Outcome).To(Equal(history.OK), "%s acquire %s: %s", c.name, key, r.Err)
	return r
}

// meanCycle is a's mean time to acquire key (free) and release it, over n
// cycles.
func meanCycle(a *lockClient, key string, n int) time.Duration {
	var total time.Duration
	for range n {
		start := time.Now()
		acquireOK(a, key, 20*time.Second)
		Expect(a.do(wire.Command{Cmd: "release", Key: key}).Outcome).To(Equal(history.OK))
		total += time.Since(start)
	}
	return total / time.Duration(n)
}

// failsClosed checks the store's quorum, lost at lossAt: h's holding
// (acquired as rh) sees Done fire within its lease, and c's try-acquire of key
// fails, with an error, within a bounded time. It returns how long each took
// and the acquire's reply.
func failsClosed(h *lockClient, rh wire.Reply, c *lockClient, key string, lossAt int64) (doneAfter int64, failAfter time.Duration, r wire.Reply) {
	Eventually(func() int64 { return lostAt(h, rh.Lease) }).WithTimeout(30 * time.Second).ShouldNot(BeZero())
	doneAfter = lostAt(h, rh.Lease) - lossAt
	Expect(doneAfter).To(BeNumerically("<=", int64(3*time.Second)), "Done must fire within the lease")
	start := time.Now()
	r = c.do(wire.Command{Cmd: "acquire", Key: key, Try: true, Wait: 5 * time.Second})
	failAfter = time.Since(start)
	Expect(r.Outcome).NotTo(Equal(history.OK))
	Expect(failAfter).To(BeNumerically("<", 15*time.Second))
	return doneAfter, failAfter, r
}

// lostAt is the time c recorded that its holding lease was lost, 0 if not.
func lostAt(c *lockClient, lease string) int64 {
	evs, err := history.ReadFiles(c.hist)
	Expect(err).NotTo(HaveOccurred())
	for _, e := range evs {
		if e.Op == history.OpLost && e.Lease == lease {
			return e.T
		}
	}
	return 0
}

// lastDeadline is the last safe deadline c recorded for lease.
func lastDeadline(c *lockClient, lease string) int64 {
	evs, err := history.ReadFiles(c.hist)
	Expect(err).NotTo(HaveOccurred())
	var d int64
	for _, e := range evs {
		if e.Lease == lease && e.Deadline > d && (e.Op == history.OpDeadline || e.Op == history.OpAcquire) {
			d = e.Deadline
		}
	}
	return d
}

func unwatch(keys ...string) {
	for _, k := range keys {
		obs.unwatch(k)
	}
}

func waitLeader() *process {
	var l *process
	Eventually(func() *process { l = leader(); return l }).WithTimeout(2 * time.Minute).ShouldNot(BeNil())
	return l
}

var _ = Describe("fault scenarios", func() {
	It("1: a client SIGSTOPped past its lease has its late writes rejected, and a successor held the lock meanwhile", func(ctx SpecContext) {
		key := newLock(ctx, "s1", 3, 2)
		a, b := newClient("s1-a"), newClient("s1-b")
		ra := acquireOK(a, key, 10*time.Second)
		// a writes blindly every 50ms with its token, as a process paused
		// between its check and its write would.
		_, wch := a.send(wire.Command{Cmd: "write", Key: key, N: 100, Every: 50 * time.Millisecond})
		Eventually(func() int { return len(fenceWrites(ctx, "s1")) }).Should(BeNumerically(">=", 3))
		pausedAt := a.pause()
		rb := acquireOK(b, key, 30*time.Second)
		handover := history.Mono() - pausedAt
		Expect(rb.Token).To(BeNumerically(">", ra.Token))
		Expect(b.do(wire.Command{Cmd: "write", Key: key, N: 5}).Accepted).To(Equal(5))
		a.resume()
		var wr wire.Reply
		select {
		case wr = <-wch:
		case <-time.After(time.Minute):
			Fail("the paused client's writes never finished")
		}
		Expect(wr.Stale).To(BeNumerically(">=", 1), "the paused client's late write must be rejected")
		Expect(lostAt(a, ra.Lease)).NotTo(BeZero(), "the paused client must learn it lost the lock")
		Expect(b.do(wire.Command{Cmd: "release", Key: key}).Outcome).To(Equal(history.OK))
		a.exit()
		b.exit()
		unwatch(key)
		check(ctx, result{Scenario: "1 client paused past its lease", Faults: fmt.Sprintf("SIGSTOP of the writing holder for %s", secs(handover)),
			Recovery: "successor acquired " + secs(handover) + " after the pause",
			Notes:    fmt.Sprintf("paused holder's writes: %d accepted before, %d rejected as stale after resuming", wr.Accepted, wr.Stale)}, "s1")
	})

	It("2: a response dropped after the acquire committed: the retry with the same request ID yields exactly one holding", func(ctx SpecContext) {
		const rounds = 20
		key := newLock(ctx, "s2", 3, 2)
		a := newClient("s2-a")
		var drop atomic.Bool
		proxy.SetRule(func(r *http.Request) faultproxy.Action {
			if r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/distributedlocks/"+key+"/status") &&
				strings.HasPrefix(r.UserAgent(), "s2-a") && drop.CompareAndSwap(true, false) {
				return faultproxy.DropResponse
			}
			return faultproxy.Pass
		})
		DeferCleanup(func() { proxy.SetRule(nil) })
		dropped0 := proxy.Dropped()
		for i := range rounds {
			req := fmt.Sprintf("s2-req-%d", i)
			drop.Store(true)
			r := a.do(wire.Command{Cmd: "acquire", Key: key, Req: req, Wait: 20 * time.Second})
			Expect(r.Outcome).To(Equal(history.OK), r.Err)
			Expect(drop.Load()).To(BeFalse(), "the acquire's response was dropped")
			// The same request again, from another process of the same user: the same holding.
			a2 := newClient(fmt.Sprintf("s2-a-retry%d", i))
			r2 := a2.do(wire.Command{Cmd: "acquire", Key: key, Req: req, Try: true, Wait: 10 * time.Second})
			Expect(r2.Outcome).To(Equal(history.OK), r2.Err)
			Expect(r2.Lease).To(Equal(r.Lease), "a retry with the same request ID must return the original lease")
			Expect(r2.Token).To(Equal(r.Token))
			killClient(a2) // the second handle must not release or renew
			// Drop the release's response too: it is retried and ends the holding once.
			drop.Store(true)
			Expect(a.do(wire.Command{Cmd: "release", Key: key}).Outcome).To(Equal(history.OK))
			// After the release, the request ID is over, never a second holding.
			a3 := newClient(fmt.Sprintf("s2-a-late%d", i))
			r3 := a3.do(wire.Command{Cmd: "acquire", Key: key, Req: req, Try: true, Wait: 10 * time.Second})
			Expect(r3.Outcome).To(Equal(history.Lost), "a retry after the release must say the lease is over: %s", r3.Err)
			a3.exit()
		}
		dropped := proxy.Dropped() - dropped0
		a.exit()
		unwatch(key)
		check(ctx, result{Scenario: "2 response lost after commit", Faults: fmt.Sprintf("%d responses dropped after the apiserver committed (%d acquires, %d releases)", dropped, rounds, rounds),
			Recovery: "immediate (the client's own retry)", Notes: fmt.Sprintf("%d retries with the same request ID returned the original lease, %d late retries said it was over", rounds, rounds)}, "s2")
	})

	It("3: one etcd member of three down keeps locks working; two down fails closed within bounded time; quorum back resumes", func(ctx SpecContext) {
		key, held := newLock(ctx, "s3", 3, 2), newLock(ctx, "s3", 3, 2)
		a, h, c := newClient("s3-a"), newClient("s3-h"), newClient("s3-c")
		cycle := func(n int) time.Duration { return meanCycle(a, key, n) }
		base := cycle(30)
		cp.Etcd.Members[2].Stop()
		one := cycle(30)
		GinkgoWriter.Printf("acquire+release cycle: %s with 3 members, %s with 2\n", base, one)

		rh := acquireOK(h, held, 10*time.Second)
		tokenBefore := getLock(ctx, held).Status.FencingToken
		cp.Etcd.Members[1].Stop() // a graceful stop: quorum is lost once it has exited
		lossAt := history.Mono()
		doneAfter, failAfter, r := failsClosed(h, rh, c, held, lossAt)
		GinkgoWriter.Printf("quorum lost: holder's Done after %s; acquire failed after %s with %s: %s\n", secs(doneAfter), failAfter, r.Outcome, r.Err)

		restoredAt := history.Mono()
		Expect(cp.Etcd.Members[1].Start(ctx)).To(Succeed())
		Expect(cp.Etcd.Members[2].Start(ctx)).To(Succeed())
		var rc wire.Reply
		Eventually(func() string {
			rc = c.do(wire.Command{Cmd: "acquire", Key: held, Try: true, Wait: 5 * time.Second})
			return rc.Outcome
		}).WithTimeout(3 * time.Minute).WithPolling(500 * time.Millisecond).Should(Equal(history.OK))
		recovery := history.Mono() - restoredAt
		Expect(rc.Token).To(BeNumerically(">", tokenBefore))
		Expect(rc.Token).To(BeNumerically(">", rh.Token))
		Expect(c.do(wire.Command{Cmd: "release", Key: held}).Outcome).To(Equal(history.OK))
		after := cycle(10)
		a.exit()
		h.exit()
		c.exit()
		unwatch(key, held)
		check(ctx, result{Scenario: "3 etcd members stopped", Faults: "1 of 3 members stopped; then 2 of 3 (quorum lost); then both restarted",
			Recovery: fmt.Sprintf("%s from quorum restored to the next acquisition", secs(recovery)),
			Notes: fmt.Sprintf("acquire+release cycle %s with 3 members, %s with 2, %s after recovery; quorum lost: holder's Done %s after the loss, acquire failed after %s (%s: %s)",
				base.Round(time.Millisecond), one.Round(time.Millisecond), after.Round(time.Millisecond), secs(doneAfter), failAfter.Round(time.Millisecond), r.Outcome, firstLine(r.Err))}, "s3")
	})

	It("4: kube-apiserver SIGKILLed and restarted under load; a release sent across the restart succeeds, a rule's refusal stays final", func(ctx SpecContext) {
		keys := []string{newLock(ctx, "s4", 3, 2), newLock(ctx, "s4", 3, 2), newLock(ctx, "s4", 3, 2)}
		var cs []*lockClient
		for i := range 4 {
			c := newClient(fmt.Sprintf("s4-c%d", i))
			c.do(wire.Command{Cmd: "loop", Keys: keys, N: 2, Wait: 5 * time.Second, Seed: uint64(i)})
			cs = append(cs, c)
		}
		// A holding whose lease outlasts the outage, and a lock the
		// controller's user is refused by a rule ([kubelock:controller-only]).
		held, ruled := newLock(ctx, "s4", 30, 2), newLock(ctx, "s4", 3, 2)
		h := newClient("s4-h")
		acquireOK(h, held, 10*time.Second)
		var sent suite.Requests
		controller, err := lock.New(sent.Count(cp.userConfig(controllerUser, "system:masters")), lock.WithNamespace(namespace), lock.WithIdentity(controllerUser))
		Expect(err).NotTo(HaveOccurred())
		Eventually(func() int { return countOK(events("s4")) }).Should(BeNumerically(">=", 20))
		// The holder's writes sent while the apiserver is down wait at the
		// proxy and reach the apiserver the moment it listens, before its
		// authorizer has loaded the RBAC rules that allow them.
		proxy.SetRule(func(r *http.Request) faultproxy.Action {
			if r.Method == http.MethodPut && strings.HasPrefix(r.UserAgent(), "s4-h") {
				return faultproxy.Hold
			}
			return faultproxy.Pass
		})
		DeferCleanup(func() { proxy.SetRule(nil) })
		// Whether the starting apiserver answers the held release before its
		// RBAC rules are loaded is a race with its informers, which it has
		// lost in every run so far; should it win, the apiserver is
		// restarted again (up to three times) rather than the window untested.
		refused := make(chan ruleRefusal, 1)
		var (
			restart, releasedAfter, refusedWrites int64
			restarts                              int
		)
		for restarts = 1; ; restarts++ {
			forbiddenBefore := proxy.Forbidden("s4-h")
			cp.APIServer().Kill()
			_, released := h.send(wire.Command{Cmd: "release", Key: held})
			if restarts == 1 {
				go func() {
					defer GinkgoRecover()
					refused <- refuseOnRestart(ctx, controller, &sent, ruled)
				}()
			}
			// The apiserver stays down for a scheduled 3s.
			time.Sleep(3 * time.Second)
			restart = history.Mono()
			Expect(cp.APIServer().Start(ctx)).To(Succeed())
			Expect(cp.ready(ctx)).To(Succeed())

			var rr wire.Reply
			Eventually(released).WithTimeout(time.Minute).Should(Receive(&rr))
			Expect(rr.Outcome).To(Equal(history.OK), "the release sent across the restart: %s", rr.Err)
			releasedAfter = history.Mono() - restart
			refusedWrites = proxy.Forbidden("s4-h") - forbiddenBefore
			if refusedWrites >= 1 || restarts == 3 {
				break
			}
			GinkgoWriter.Printf("restart %d: the starting apiserver answered the held release with its RBAC loaded; restarting it again\n", restarts)
			acquireOK(h, held, 10*time.Second)
		}
		Expect(refusedWrites).To(BeNumerically(">=", 1), "in %d restarts the restarted apiserver never refused the holder: the release did not cross the window it is tested in", restarts)
		var rf ruleRefusal
		Eventually(refused).WithTimeout(time.Minute).Should(Receive(&rf))
		Expect(apierrors.IsForbidden(rf.err)).To(BeTrue(), "the controller's acquire: %v", rf.err)
		Expect(rf.err.Error()).To(ContainSubstring("[kubelock:controller-only]"))
		Expect(rf.sent.Refused).To(Equal(1), "the rule's 403 was sent again")
		Expect(rf.sent.Polls).To(BeZero(), "the rule's 403 was taken for a starting apiserver's")
		// RBAC's refusal, now that the apiserver is ready, is final too.
		var stranger suite.Requests
		sc, err := lock.New(stranger.Count(cp.userConfig("faults-stranger")), lock.WithNamespace(namespace), lock.WithIdentity("faults-stranger"))
		Expect(err).NotTo(HaveOccurred())
		_, err = sc.TryAcquire(ctx, ruled)
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "a user without RBAC: %v", err)
		Expect(err.Error()).To(ContainSubstring(`User "faults-stranger" cannot`))
		Expect(stranger.Get()).To(Equal(suite.Sent{Refused: 1, Polls: 1}), "what the refused user sent")

		base := countOKAfter(events("s4"), restart)
		Eventually(func() int { return countOKAfter(events("s4"), restart) }).WithTimeout(2 * time.Minute).Should(BeNumerically(">", base))
		recovery := firstOKAfter(events("s4"), restart) - restart
		Eventually(func() int { return countOKAfter(events("s4"), restart) }).WithTimeout(2 * time.Minute).Should(BeNumerically(">=", 20))
		for _, c := range cs {
			c.do(wire.Command{Cmd: "stop"})
			c.exit()
		}
		h.exit()
		unwatch(append(keys, held, ruled)...)
		check(ctx, result{Scenario: "4 kube-apiserver killed under load", Faults: fmt.Sprintf("SIGKILL of kube-apiserver with 4 looping clients on 3 locks, down 3s, restarted (%d×); a holder's release sent while it was down", restarts),
			Recovery: secs(recovery) + " from restart to the next acquisition",
			Notes: fmt.Sprintf("the holder's writes, held at the proxy until the apiserver listened, got %d 403s from the starting apiserver and were sent again: its release succeeded %s after the restart; the controller's acquire, sent the moment the apiserver listened and answered %s, returned after one 403 ([kubelock:controller-only]) and no /readyz poll; a user without RBAC, once ready, after one 403 and one poll",
				refusedWrites, secs(releasedAfter), rf.when())}, "s4")
	})

	It("5: the leader manager SIGKILLed mid-expiry: the standby takes over, nothing expires early, expiry resumes", func(ctx SpecContext) {
		var keys []string
		var holders []*lockClient
		var leases []string
		for i := range 3 {
			k := newLock(ctx, "s5", 3, 2)
			c := newClient(fmt.Sprintf("s5-h%d", i))
			leases = append(leases, acquireOK(c, k, 10*time.Second).Lease)
			keys, holders = append(keys, k), append(holders, c)
		}
		old := waitLeader()
		for _, c := range holders {
			killClient(c) // the holders crash: their leases now wait for the controller
		}
		time.Sleep(time.Second) // scheduled: kill the leader while the expiries are pending
		killedAt := old.kill()
		// The standby takes over (after the leader lease) and expires all three.
		Eventually(func() int { return len(obs.expiries("s5")) }).WithTimeout(2 * time.Minute).Should(Equal(3))
		exp := obs.expiries("s5")
		first := int64(0)
		var margins []string
		for i, lease := range leases {
			e, ok := exp[lease]
			Expect(ok).To(BeTrue())
			d := lastDeadline(holders[i], lease)
			Expect(e[1]).To(BeNumerically(">=", d), "lease %s expired before its holder's safe deadline could pass", lease)
			if first == 0 || e[0] < first {
				first = e[0]
			}
			margins = append(margins, secs(e[1]-d))
		}
		newLeader := waitLeader()
		tl := failoverTimeline(newLeader, killedAt)
		tl.markAt(first, "first expiry observed")
		tl.log("failover, from the kill of " + old.name)
		unwatch(keys...)
		check(ctx, result{Scenario: "5 leader manager killed mid-expiry", Faults: fmt.Sprintf("SIGKILL of the leader (%s) with 3 crashed holders awaiting expiry", old.name),
			Recovery: fmt.Sprintf("%s from the kill to the first expiry (by %s)", secs(first-killedAt), newLeader.name),
			Notes:    fmt.Sprintf("each lease was still seen held %s after its holder's safe deadline", strings.Join(margins, ", "))}, "s5")
	})

	It("6: with the webhook down every lock write fails closed and nothing changes; back up, service resumes", func(ctx SpecContext) {
		key, free := newLock(ctx, "s6", 3, 2), newLock(ctx, "s6", 3, 2)
		h, c, w := newClient("s6-h"), newClient("s6-c"), newClient("s6-w")
		rh := acquireOK(h, key, 10*time.Second)
		for _, m := range managers {
			m.supervise(false)
		}
		downAt := history.Mono()
		for _, m := range managers {
			m.kill()
		}
		before, freeBefore := getLock(ctx, key), getLock(ctx, free)
		// A client blocked in Acquire through the outage, as an application
		// waits: its writes fail ("failed calling webhook") and it retries,
		// its back-off at its cap by the restart.
		var attempts atomic.Int64
		var restarted atomic.Pointer[timeline]
		proxy.SetRule(func(r *http.Request) faultproxy.Action {
			if r.Method == http.MethodPut && strings.HasPrefix(r.UserAgent(), "s6-w") {
				attempts.Add(1)
				if tl := restarted.Load(); tl != nil {
					tl.mark("the waiter's first write after the restart")
				}
			}
			return faultproxy.Pass
		})
		DeferCleanup(func() { proxy.SetRule(nil) })
		_, wch := w.send(wire.Command{Cmd: "acquire", Key: free, Wait: 2 * time.Minute})
		start := time.Now()
		r := c.do(wire.Command{Cmd: "acquire", Key: free, Try: true, Wait: 5 * time.Second})
		failAfter := time.Since(start)
		Expect(r.Outcome).NotTo(Equal(history.OK))
		Expect(r.Err).To(ContainSubstring("webhook"))
		// The holder cannot renew: its Done fires by its safe deadline.
		Eventually(func() int64 { return lostAt(h, rh.Lease) }).WithTimeout(30 * time.Second).ShouldNot(BeZero())
		rr := h.do(wire.Command{Cmd: "release", Key: key})
		after := getLock(ctx, key)
		Expect(after.ResourceVersion).To(Equal(before.ResourceVersion), "no lock write may pass while the webhook is down")
		Expect(getLock(ctx, free).ResourceVersion).To(Equal(freeBefore.ResourceVersion))
		Expect(after.Status.Holder).NotTo(BeNil())
		Expect(after.Status.Holder.LeaseID).To(Equal(rh.Lease))
		Expect(attempts.Load()).To(BeNumerically(">=", 2), "the waiter's writes should be failing at the webhook")
		upAt := history.Mono()
		tl := newTimeline(upAt)
		restarted.Store(tl)
		wctx, stopWatching := context.WithCancel(ctx)
		defer stopWatching()
		for i, m := range managers {
			m.supervise(true)
			Expect(m.start()).To(Succeed())
			tl.mark(m.name + " started")
			tl.watchListening(wctx, m.name, lb.backends[i])
		}
		tl.watchLeader(wctx)
		var rw wire.Reply
		select {
		case rw = <-wch:
		case <-time.After(2 * time.Minute):
			Fail("the waiter never acquired the free lock after the webhook came back")
		}
		Expect(rw.Outcome).To(Equal(history.OK), rw.Err)
		tl.mark("the waiter acquired the free lock")
		Expect(w.do(wire.Command{Cmd: "release", Key: free}).Outcome).To(Equal(history.OK))
		// The abandoned holding ends only by expiry: a new leader first, then
		// a full lease and the grace from its takeover.
		var rc wire.Reply
		Eventually(func() string {
			rc = c.do(wire.Command{Cmd: "acquire", Key: key, Try: true, Wait: 5 * time.Second})
			return rc.Outcome
		}).WithTimeout(2 * time.Minute).WithPolling(200 * time.Millisecond).Should(Equal(history.OK))
		tl.mark("the abandoned lock acquired")
		if e, ok := obs.expiries("s6")[rh.Lease]; ok {
			tl.markAt(e[0], "the abandoned holding seen expired")
		}
		tl.log("scenario 6, after the restart")
		Expect(rc.Token).To(BeNumerically(">", rh.Token))
		Expect(c.do(wire.Command{Cmd: "release", Key: key}).Outcome).To(Equal(history.OK))
		h.exit()
		c.exit()
		w.exit()
		unwatch(key, free)
		check(ctx, result{Scenario: "6 webhook down", Faults: fmt.Sprintf("both operator replicas (the webhook's only backends) SIGKILLed for %s", secs(upAt-downAt)),
			Recovery: fmt.Sprintf("%s from restart to the next acquisition (a client blocked in Acquire through the outage); the abandoned holding taken over %s after restart",
				secs(tl.since("the waiter acquired the free lock")), secs(tl.since("the abandoned lock acquired"))),
			Notes: fmt.Sprintf("during the outage: acquire of a free lock failed after %s (%s: %s); renewals failed so the holder's Done fired; its release: %s; both locks' resourceVersion unchanged; after the restart: %s",
				failAfter.Round(time.Millisecond), r.Outcome, firstLine(r.Err), rr.Outcome, tl)}, "s6")
	})

	It("7: waiters cancelled and killed while queued: the queue drains in order without a stuck head beyond handoffTimeoutSeconds", func(ctx SpecContext) {
		const handoff = 2
		key := newLock(ctx, "s7", 3, handoff)
		h := newClient("s7-h")
		acquireOK(h, key, 10*time.Second)
		type waiter struct {
			c  *lockClient
			id int64
			ch <-chan wire.Reply
		}
		var ws []waiter
		for i := range 6 {
			c := newClient(fmt.Sprintf("s7-w%d", i))
			id, ch := c.send(wire.Command{Cmd: "acquire", Key: key, Wait: 2 * time.Minute})
			ws = append(ws, waiter{c, id, ch})
			Eventually(func() int { return len(getLock(ctx, key).Status.Waiters) }).Should(Equal(i + 1))
		}
		// w1 cancels, w2 and w4 are killed while queued.
		ws[1].c.do(wire.Command{Cmd: "cancel", Target: ws[1].id})
		Expect((<-ws[1].ch).Outcome).To(Equal(history.Canceled))
		killClient(ws[2].c)
		killClient(ws[4].c)
		// The cancelled waiter leaves the queue itself; the killed ones stay until the controller drops them.
		Eventually(func() int { return len(getLock(ctx, key).Status.Waiters) }).Should(Equal(5))
		Expect(h.do(wire.Command{Cmd: "release", Key: key}).Outcome).To(Equal(history.OK))
		prev := history.Mono()
		var order []string
		var gaps []string
		maxGap := int64(0)
		for _, i := range []int{0, 3, 5} {
			var r wire.Reply
			select {
			case r = <-ws[i].ch:
			case <-time.After(time.Minute):
				Fail(fmt.Sprintf("waiter %d never got the lock", i))
			}
			Expect(r.Outcome).To(Equal(history.OK), r.Err)
			got := history.Mono()
			gap := got - prev
			maxGap = max(maxGap, gap)
			gaps = append(gaps, secs(gap))
			order = append(order, ws[i].c.name)
			Expect(ws[i].c.do(wire.Command{Cmd: "release", Key: key}).Outcome).To(Equal(history.OK))
			prev = history.Mono()
		}
		// A killed head is dropped after handoffTimeoutSeconds (plus the controller's grace and a poll).
		Expect(maxGap).To(BeNumerically("<=", int64((handoff+4)*time.Second)))
		Expect(getLock(ctx, key).Status.Waiters).To(BeEmpty())
		// Acquisition order is queue order.
		acq := acquisitionOrder(events("s7"))
		Expect(acq).To(Equal(append([]string{"s7-h"}, order...)))
		for _, i := range []int{0, 1, 3, 5} {
			ws[i].c.exit()
		}
		h.exit()
		unwatch(key)
		check(ctx, result{Scenario: "7 waiters cancelled and killed while queued", Faults: "6 queued waiters: 1 cancelled, 2 SIGKILLed (one of them becomes the head)",
			Recovery: fmt.Sprintf("longest hand-off %s (handoffTimeoutSeconds %d)", secs(maxGap), handoff),
			Notes:    fmt.Sprintf("acquired in queue order %v; hand-off gaps %v", order, gaps)}, "s7")
	})

	It("8: the managers' wall clock jumps forward: no early expiry, since expiry uses observed monotonic time", func(ctx SpecContext) {
		key, crashedKey := newLock(ctx, "s8", 3, 2), newLock(ctx, "s8", 3, 2)
		h, x := newClient("s8-h"), newClient("s8-x")
		rh := acquireOK(h, key, 10*time.Second)
		rx := acquireOK(x, crashedKey, 10*time.Second)
		waitLeader()
		for _, off := range offsets {
			Expect(os.WriteFile(off, []byte("1h"), 0o644)).To(Succeed())
		}
		DeferCleanup(func() {
			for _, off := range offsets {
				_ = os.WriteFile(off, []byte("0s"), 0o644)
			}
		})
		jumpedAt := history.Mono()
		killClient(x)
		// Three leases long, the live holder keeps its lock and writes.
		w := h.do(wire.Command{Cmd: "write", Key: key, N: 45, Every: 200 * time.Millisecond})
		Expect(w.Accepted).To(Equal(45))
		Expect(lostAt(h, rh.Lease)).To(BeZero(), "a live holder lost its lock after the controller's wall clock jumped")
		// The crashed holder's lease expires, but not before its safe deadline.
		Eventually(func() map[string][2]int64 { return obs.expiries("s8") }).Should(HaveKey(rx.Lease))
		e := obs.expiries("s8")[rx.Lease]
		d := lastDeadline(x, rx.Lease)
		Expect(e[1]).To(BeNumerically(">=", d))
		endTime := getLock(ctx, crashedKey).Status.RecentAcquisitions
		Expect(endTime).NotTo(BeEmpty())
		skew := time.Until(endTime[len(endTime)-1].EndTime.Time)
		// And back.
		for _, off := range offsets {
			Expect(os.WriteFile(off, []byte("-1h"), 0o644)).To(Succeed())
		}
		w2 := h.do(wire.Command{Cmd: "write", Key: key, N: 30, Every: 200 * time.Millisecond})
		Expect(w2.Accepted).To(Equal(30))
		Expect(lostAt(h, rh.Lease)).To(BeZero())
		Expect(h.do(wire.Command{Cmd: "release", Key: key}).Outcome).To(Equal(history.OK))
		h.exit()
		unwatch(key, crashedKey)
		check(ctx, result{Scenario: "8 manager wall clock jumps", Faults: "both managers' wall clocks +1h, then -1h (monotonic clock untouched)",
			Recovery: "none needed",
			Notes: fmt.Sprintf("live holder kept the lock through %s of +1h and 6s of -1h; the crashed holder's lease expired %s after its safe deadline (endTime written %s ahead of real time)",
				secs(history.Mono()-jumpedAt), secs(e[1]-d), skew.Round(time.Second))}, "s8")
	})
})

// ruleRefusal is how the apiserver answered a write a rule refuses, sent
// the moment it listened again after a restart.
type ruleRefusal struct {
	err  error
	sent suite.Sent
	// notReady: /readyz still failed once the answer came.
	notReady bool
}

func (r ruleRefusal) when() string {
	if r.notReady {
		return "while /readyz failed"
	}
	return "once /readyz passed"
}

// refuseOnRestart waits until the apiserver listens again, then has c, as the
// controller's user, acquire key, which [kubelock:controller-only] refuses.
func refuseOnRestart(ctx context.Context, c *lock.Client, sent *suite.Requests, key string) ruleRefusal {
	u, err := url.Parse(cp.URL())
	must(err)
	Expect(awaitListening(ctx, u.Host)).To(Succeed())
	before := sent.Get()
	_, err = c.TryAcquire(ctx, key)
	return ruleRefusal{err: err, sent: sent.Since(before), notReady: !readyzPasses(ctx)}
}

// readyzPasses reports whether the apiserver's /readyz passes now.
func readyzPasses(ctx context.Context) bool {
	hc, err := rest.HTTPClientFor(cp.admin)
	must(err)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, cp.URL()+"/readyz", nil)
	must(err)
	resp, err := hc.Do(req)
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// awaitListening returns once addr accepts TCP connections, or ctx's error.
func awaitListening(ctx context.Context, addr string) error {
	var d net.Dialer
	for {
		dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		c, err := d.DialContext(dctx, "tcp", addr)
		cancel()
		if err == nil {
			return c.Close()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 160 {
		s = s[:160] + "…"
	}
	return strings.ReplaceAll(s, "|", "/")
}

func countOK(evs []history.Event) int { return countOKAfter(evs, 0) }

func countOKAfter(evs []history.Event, t int64) int {
	n := 0
	for _, e := range evs {
		if e.Op == history.OpAcquire && e.Phase == history.Return && e.Outcome == history.OK && e.T > t {
			n++
		}
	}
	return n
}

func firstOKAfter(evs []history.Event, t int64) int64 {
	first := int64(0)
	for _, e := range evs {
		if e.Op == history.OpAcquire && e.Phase == history.Return && e.Outcome == history.OK && e.T > t && (first == 0 || e.T < first) {
			first = e.T
		}
	}
	return first
}

// acquisitionOrder lists the processes in the order their acquisitions returned.
func acquisitionOrder(evs []history.Event) []string {
	var acq []history.Event
	for _, e := range evs {
		if e.Op == history.OpAcquire && e.Phase == history.Return && e.Outcome == history.OK {
			acq = append(acq, e)
		}
	}
	sort.Slice(acq, func(i, j int) bool { return acq[i].T < acq[j].T })
	var out []string
	for _, e := range acq {
		out = append(out, e.Proc)
	}
	return slices.Compact(out)
}
