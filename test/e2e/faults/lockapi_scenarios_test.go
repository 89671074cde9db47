//go:build faults

package faults

import (
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubelock/kubelock/internal/proc"
	"github.com/kubelock/kubelock/test/e2e/faults/wire"
	"github.com/kubelock/kubelock/test/faultproxy"
	"github.com/kubelock/kubelock/test/history"
)

// The lock apiserver backend's fault scenarios: the lock API served by two
// kubelock-apiserver replicas from a lock etcd of three members, behind
// kube-apiserver's aggregation layer. Every scenario checks I1–I7 and
// linearizability over its recorded history, as the CRD backend's do.
var _ = Describe("lock apiserver backend", Ordered, func() {
	var b *lockBackend
	BeforeAll(func(ctx SpecContext) {
		b = startLockBackend(ctx)
	}, NodeTimeout(10*time.Minute))

	// loopers starts n clients looping over keys (2 checked writes per holding).
	loopers := func(prefix string, n int, keys []string) []*lockClient {
		var cs []*lockClient
		for i := range n {
			c := newClient(fmt.Sprintf("%s-c%d", prefix, i))
			c.do(wire.Command{Cmd: "loop", Keys: keys, N: 2, Wait: 5 * time.Second, Seed: uint64(i)})
			cs = append(cs, c)
		}
		return cs
	}
	stopLoopers := func(cs []*lockClient) {
		for _, c := range cs {
			c.do(wire.Command{Cmd: "stop"})
			c.exit()
		}
	}

	It("1: a replica SIGSTOPped past a lease, then one SIGKILLed, under load: clients keep working through the other", func(ctx SpecContext) {
		const pauseFor = 9 * time.Second // three leases
		keys := []string{newLock(ctx, "la1", 3, 2), newLock(ctx, "la1", 3, 2), newLock(ctx, "la1", 3, 2)}
		served := []int{b.lockWrites(ctx, b.replicas[0]), b.lockWrites(ctx, b.replicas[1])}
		cs := loopers("la1", 4, keys)
		Eventually(func() int { return countOK(events("la1")) }).Should(BeNumerically(">=", 20))
		// kube-apiserver spreads the lock writes over both replicas.
		for i, r := range b.replicas {
			Eventually(func() int { return b.lockWrites(ctx, r) }).Should(BeNumerically(">", served[i]), "replica %d served no lock write", i)
		}

		paused := b.replicas[1]
		pausedAt := history.Mono()
		Expect(paused.APIServer.Signal(syscall.SIGSTOP)).To(Succeed())
		Eventually(func() bool { return b.probe.isReady(1) }).WithTimeout(30 * time.Second).Should(BeFalse())
		outAfter := b.probe.since(1) - pausedAt
		Eventually(func() int { return countOKAfter(events("la1"), pausedAt) }).WithTimeout(pauseFor).Should(BeNumerically(">=", 5),
			"clients stopped acquiring while a replica was paused")
		time.Sleep(pauseFor - time.Duration(history.Mono()-pausedAt)) // the rest of the scheduled pause
		okPaused := countOKAfter(events("la1"), pausedAt)
		resumedAt := history.Mono()
		Expect(paused.APIServer.Signal(syscall.SIGCONT)).To(Succeed())
		Eventually(func() bool { return b.probe.isReady(1) }).WithTimeout(time.Minute).Should(BeTrue())
		backAfter := b.probe.since(1) - resumedAt

		killed := b.replicas[0]
		killedAt := history.Mono()
		Expect(killed.APIServer.Signal(syscall.SIGKILL)).To(Succeed())
		<-killed.APIServer.Done()
		Eventually(func() int { return countOKAfter(events("la1"), killedAt) }).WithTimeout(time.Minute).Should(BeNumerically(">=", 10),
			"clients stopped acquiring after a replica was killed")
		afterKill := firstOKAfter(events("la1"), killedAt) - killedAt
		Eventually(func() bool { return b.probe.isReady(0) }).WithTimeout(30 * time.Second).Should(BeFalse())
		killOut := b.probe.since(0) - killedAt
		// Its Deployment starts it again; it serves lock writes again.
		Expect(killed.Restart(ctx)).To(Succeed())
		Eventually(func() bool { return b.probe.isReady(0) }).WithTimeout(time.Minute).Should(BeTrue())
		restarted := b.lockWrites(ctx, killed)
		Eventually(func() int { return b.lockWrites(ctx, killed) }).WithTimeout(time.Minute).Should(BeNumerically(">", restarted))

		stopLoopers(cs)
		unwatch(keys...)
		check(ctx, result{Scenario: "lock apiserver 1 replicas paused and killed under load", Faults: fmt.Sprintf("SIGSTOP of one of 2 kubelock-apiserver replicas for %s, then SIGKILL of the other (restarted), 4 looping clients on 3 locks", secs(int64(pauseFor))),
			Recovery: fmt.Sprintf("none needed: %d acquisitions while one replica was paused; first acquisition %s after the kill", okPaused, secs(afterKill)),
			Notes: fmt.Sprintf("the paused replica out of the Service %s after the pause, back %s after SIGCONT; the killed one out %s after the kill",
				secs(outAfter), secs(backAfter), secs(killOut))}, "la1")
	})

	It("2: one lock-etcd member down keeps locks working; two down fails closed within bounded time; quorum back resumes", func(ctx SpecContext) {
		key, held, free := newLock(ctx, "la2", 3, 2), newLock(ctx, "la2", 3, 2), newLock(ctx, "la2", 3, 2)
		a, h, c := newClient("la2-a"), newClient("la2-h"), newClient("la2-c")
		cycle := func(n int) time.Duration { return meanCycle(a, key, n) }
		members := b.etcd.Members
		base := cycle(20)
		Expect(members[2].Stop()).To(Succeed())
		one := cycle(20)

		rh := acquireOK(h, held, 10*time.Second)
		tokenBefore := getLock(ctx, held).Status.FencingToken
		freeBefore := getLock(ctx, free).ResourceVersion
		Expect(members[1].Stop()).To(Succeed()) // a graceful stop: quorum is lost once it has exited
		lossAt := history.Mono()
		doneAfter, failAfter, r := failsClosed(h, rh, c, free, lossAt)
		GinkgoWriter.Printf("lock-etcd quorum lost: holder's Done after %s; acquire failed after %s with %s: %s\n", secs(doneAfter), failAfter, r.Outcome, r.Err)

		restoredAt := history.Mono()
		Expect(members[1].Start(ctx)).To(Succeed())
		Expect(members[2].Start(ctx)).To(Succeed())
		healthyAfter := history.Mono() - restoredAt
		var rc wire.Reply
		Eventually(func() string {
			rc = c.do(wire.Command{Cmd: "acquire", Key: held, Try: true, Wait: 5 * time.Second})
			return rc.Outcome
		}).WithTimeout(3 * time.Minute).WithPolling(500 * time.Millisecond).Should(Equal(history.OK))
		recovery := history.Mono() - restoredAt
		// Where the recovery went: the lock etcd's start, then the replicas' readiness.
		Eventually(func() bool { return b.probe.isReady(0) && b.probe.isReady(1) }).Should(BeTrue())
		inService := "the replicas stayed in the Service"
		if back := max(b.probe.since(0), b.probe.since(1)); back > lossAt {
			inService = fmt.Sprintf("both replicas, out of the Service during the outage, back in it %s after the restart began", secs(back-restoredAt))
		}
		Expect(rc.Token).To(BeNumerically(">", tokenBefore))
		Expect(rc.Token).To(BeNumerically(">", rh.Token))
		// The acquire refused during the outage changed nothing, not even later.
		Expect(getLock(ctx, free).ResourceVersion).To(Equal(freeBefore), "a write refused while quorum was lost committed")
		Expect(c.do(wire.Command{Cmd: "release", Key: held}).Outcome).To(Equal(history.OK))
		after := cycle(10)
		a.exit()
		h.exit()
		c.exit()
		unwatch(key, held, free)
		check(ctx, result{Scenario: "lock apiserver 2 lock-etcd members stopped", Faults: "1 of 3 lock-etcd members stopped; then 2 of 3 (quorum lost); then both restarted",
			Recovery: fmt.Sprintf("%s from quorum restored to the next acquisition", secs(recovery)),
			Notes: fmt.Sprintf("acquire+release cycle %s with 3 members, %s with 2, %s after recovery; quorum lost: holder's Done %s after the loss, acquire failed after %s (%s: %s); after the restart began: both members healthy %s, %s",
				base.Round(time.Millisecond), one.Round(time.Millisecond), after.Round(time.Millisecond), secs(doneAfter), failAfter.Round(time.Millisecond), r.Outcome, firstLine(r.Err),
				secs(healthyAfter), inService)}, "la2")
	})

	It("3: kube-apiserver SIGKILLed and restarted under load: the lock store is unaffected, a release sent across the restart succeeds", func(ctx SpecContext) {
		keys := []string{newLock(ctx, "la3", 3, 2), newLock(ctx, "la3", 3, 2), newLock(ctx, "la3", 3, 2)}
		cs := loopers("la3", 4, keys)
		// A holding whose lease outlasts the outage, long enough that it does
		// not renew in the scenario: its only write held at the proxy is the
		// release.
		held := newLock(ctx, "la3", 300, 2)
		h := newClient("la3-h")
		rh := acquireOK(h, held, 10*time.Second)
		Eventually(func() int { return countOK(events("la3")) }).Should(BeNumerically(">=", 20))
		// The holder's writes sent while kube-apiserver is down wait at the
		// proxy and reach it the moment it listens.
		proxy.SetRule(func(r *http.Request) faultproxy.Action {
			if r.Method == http.MethodPut && strings.HasPrefix(r.UserAgent(), "la3-h") {
				return faultproxy.Hold
			}
			return faultproxy.Pass
		})
		DeferCleanup(func() { proxy.SetRule(nil) })
		answersBefore, waitedBefore := proxy.Answers("la3-h"), proxy.Waited("la3-h")
		runs := []*proc.Child{b.replicas[0].APIServer, b.replicas[1].APIServer}
		cp.APIServer().Kill()
		_, released := h.send(wire.Command{Cmd: "release", Key: held})
		// kube-apiserver stays down for a scheduled 3s.
		time.Sleep(3 * time.Second)
		restart := history.Mono()
		Expect(cp.APIServer().Start(ctx)).To(Succeed())
		Expect(cp.ready(ctx)).To(Succeed())
		readyAfter := history.Mono() - restart

		var rr wire.Reply
		Eventually(released).WithTimeout(time.Minute).Should(Receive(&rr))
		Expect(rr.Outcome).To(Equal(history.OK), "the release sent across the restart: %s", rr.Err)
		releasedAfter := history.Mono() - restart
		// What the starting kube-apiserver answers first depends on which of
		// its informers have synced (the authorizer's 403, the aggregator's 503
		// before the APIService is available, a write served): reported, not
		// assumed. That the release waited for the restart is certain.
		Expect(proxy.Waited("la3-h")-waitedBefore).To(BeNumerically(">=", 1), "the holder's release never waited for kube-apiserver: it was not sent across the restart")
		answers := answersSince(proxy.Answers("la3-h"), answersBefore)
		Expect(getLock(ctx, held).Status.Holder).To(BeNil(), "the released lock is still held")
		Expect(getLock(ctx, held).Status.FencingToken).To(Equal(rh.Token), "the lock store lost or changed the holding meanwhile")

		base := countOKAfter(events("la3"), restart)
		Eventually(func() int { return countOKAfter(events("la3"), restart) }).WithTimeout(2 * time.Minute).Should(BeNumerically(">", base))
		recovery := firstOKAfter(events("la3"), restart) - restart
		Eventually(func() int { return countOKAfter(events("la3"), restart) }).WithTimeout(2 * time.Minute).Should(BeNumerically(">=", 20))
		// The lock store never noticed: the same replica processes serve on.
		for i, r := range b.replicas {
			Expect(r.APIServer).To(BeIdenticalTo(runs[i]))
			Expect(r.APIServer.Exited()).To(Succeed())
		}
		stopLoopers(cs)
		h.exit()
		unwatch(append(keys, held)...)
		check(ctx, result{Scenario: "lock apiserver 3 kube-apiserver killed under load", Faults: "SIGKILL of kube-apiserver (the aggregation layer) with 4 looping clients on 3 locks, down 3s, restarted; a holder's release sent while it was down",
			Recovery: secs(recovery) + " from restart to the next acquisition",
			Notes: fmt.Sprintf("kube-apiserver ready %s after the restart; the holder's release, held at the proxy until kube-apiserver listened, succeeded %s after the restart (its requests since the kill were answered %s); both kubelock-apiserver replicas and the lock etcd ran on untouched",
				secs(readyAfter), secs(releasedAfter), answers)}, "la3")
	})
})
