//go:build faults

package faults

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/fencing/postgres"
	"github.com/kubelock/kubelock/test/e2e/faults/wire"
	"github.com/kubelock/kubelock/test/faultproxy"
	"github.com/kubelock/kubelock/test/history"
)

// sessionTTL is the sessions' TTL in these scenarios: the shortest allowed.
const sessionTTL = locksv1alpha1.MinSessionTTLSeconds * time.Second

// sessionHolder starts a client named name, creates its session and acquires
// n new locks (prefix) in it. It returns the client, the session's name, the
// keys and the replies.
func sessionHolder(ctx context.Context, name, prefix string, n int) (*lockClient, string, []string, []wire.Reply) {
	c := newClient(name)
	r := c.do(wire.Command{Cmd: "session", TTL: sessionTTL})
	ExpectWithOffset(1, r.Outcome).To(Equal(history.OK), "%s: session: %s", name, r.Err)
	var keys []string
	var held []wire.Reply
	for range n {
		k := newLock(ctx, prefix, 3, 2)
		a := c.do(wire.Command{Cmd: "acquire", Key: k, InSession: true, Wait: 10 * time.Second})
		ExpectWithOffset(1, a.Outcome).To(Equal(history.OK), "%s acquire %s in session %s: %s", name, k, r.Session, a.Err)
		keys, held = append(keys, k), append(held, a)
	}
	return c, r.Session, keys, held
}

// blindWrites starts n fenced writes every 100ms on each key with c's token,
// unchecked, as a process paused between its check and its write would.
func blindWrites(c *lockClient, keys []string, n int) []<-chan wire.Reply {
	var chs []<-chan wire.Reply
	for _, k := range keys {
		_, ch := c.send(wire.Command{Cmd: "write", Key: k, N: n, Every: 100 * time.Millisecond})
		chs = append(chs, ch)
	}
	return chs
}

// writeTotals waits for the replies of blindWrites and checks that every key
// had a late write refused as stale.
func writeTotals(chs []<-chan wire.Reply) (accepted, stale int) {
	for i, ch := range chs {
		var r wire.Reply
		select {
		case r = <-ch:
		case <-time.After(2 * time.Minute):
			Fail(fmt.Sprintf("the writes on key %d never finished", i))
		}
		ExpectWithOffset(1, r.Stale).To(BeNumerically(">=", 1), "key %d: the late write of the lost holder must be refused", i)
		accepted, stale = accepted+r.Accepted, stale+r.Stale
	}
	return accepted, stale
}

// takeOver acquires every key with b, checks the tokens grew past held's and
// makes one fenced write on each; it returns when b acquired the first and the
// last, and the longest of b's writes.
//
// The bound it relies on: a holder paused by SIGSTOP may be stopped inside
// the guard's transaction with the key's fence row locked, so b's write can
// wait until PostgreSQL ends that transaction, postgres.DefaultIdleTimeout
// (5 s) later. The client's write gives up after 10 s.
func takeOver(b *lockClient, keys []string, held []wire.Reply) (first, last, slowestWrite int64) {
	for i, k := range keys {
		r := acquireOK(b, k, time.Minute)
		if i == 0 {
			first = history.Mono()
		}
		ExpectWithOffset(1, r.Token).To(BeNumerically(">", held[i].Token))
		sent := history.Mono()
		ExpectWithOffset(1, b.do(wire.Command{Cmd: "write", Key: k, N: 1}).Accepted).To(Equal(1))
		slowestWrite = max(slowestWrite, history.Mono()-sent)
	}
	return first, history.Mono(), slowestWrite
}

// successorWrites says how long the successor's fenced writes took at most,
// against the bound takeOver relies on.
func successorWrites(slowest int64) string {
	return fmt.Sprintf("the successor's first fenced write on each lock accepted within %s (bound: a paused holder's transaction ends after %s)", secs(slowest), postgres.DefaultIdleTimeout)
}

// expiredAfterDeadlines checks I5 per lock as the controller saw it: every
// holding of holder in leases was seen held until at least its holder's last
// safe deadline, and ended SessionExpired. It returns the smallest and
// largest margin.
func expiredAfterDeadlines(prefix string, holder func(lease string) *lockClient, leases []string) (minMargin, maxMargin int64) {
	var exp map[string][2]int64
	EventuallyWithOffset(1, func() int { exp = obs.expiries(prefix); return len(exp) }).WithTimeout(2*time.Minute).Should(BeNumerically(">=", len(leases)),
		func() string { return "the observer saw:" + obs.seenOf(obs.keysOf(prefix), leases) })
	minMargin = -1
	for _, lease := range leases {
		e, ok := exp[lease]
		ExpectWithOffset(1, ok).To(BeTrue(), "holding %s was not seen expired", lease)
		d := lastDeadline(holder(lease), lease)
		ExpectWithOffset(1, d).NotTo(BeZero())
		ExpectWithOffset(1, e[1]).To(BeNumerically(">=", d), "holding %s ended before its holder's safe deadline", lease)
		m := e[1] - d
		if minMargin < 0 || m < minMargin {
			minMargin = m
		}
		maxMargin = max(maxMargin, m)
	}
	return minMargin, maxMargin
}

// sessionDeleted waits until the controller deleted the lapsed session.
func sessionDeleted(ctx context.Context, name string) {
	EventuallyWithOffset(1, func() bool {
		err := admin.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &locksv1alpha1.LockSession{})
		return apierrors.IsNotFound(err)
	}).WithTimeout(time.Minute).Should(BeTrue(), "session %s was not deleted", name)
}

// wrapUp checks after a takeover that a's holdings all expired after their safe
// deadlines and its session was deleted, then b releases, both exit and the
// keys leave the observer. It returns the smallest and largest expiry margin.
func wrapUp(ctx context.Context, prefix, sess string, a, b *lockClient, keys []string, held []wire.Reply) (minMargin, maxMargin int64) {
	minMargin, maxMargin = expiredAfterDeadlines(prefix, func(string) *lockClient { return a }, leasesOf(held))
	sessionDeleted(ctx, sess)
	for _, k := range keys {
		ExpectWithOffset(1, b.do(wire.Command{Cmd: "release", Key: k}).Outcome).To(Equal(history.OK))
	}
	a.exit()
	b.exit()
	unwatch(keys...)
	return minMargin, maxMargin
}

func leasesOf(rs []wire.Reply) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.Lease
	}
	return out
}

var _ = Describe("fault scenarios with sessions", func() {
	It("9: a client holding 20 locks in one session SIGSTOPped past its TTL: no lock is re-acquired before its safe deadline, late writes are refused", func(ctx SpecContext) {
		const n = 20
		a, sess, keys, held := sessionHolder(ctx, "s9-a", "s9", n)
		b := newClient("s9-b")
		chs := blindWrites(a, keys, 30)
		Eventually(func() int { return len(fenceWrites(ctx, "s9")) }).Should(BeNumerically(">=", n))
		pausedAt := a.pause()
		first, last, slowest := takeOver(b, keys, held)
		a.resume()
		accepted, stale := writeTotals(chs)
		for _, r := range held {
			Eventually(func() int64 { return lostAt(a, r.Lease) }).ShouldNot(BeZero(), "the resumed client must learn it lost %s", r.Lease)
		}
		minM, maxM := wrapUp(ctx, "s9", sess, a, b, keys, held)
		check(ctx, result{Scenario: "9 session client (20 locks) paused past its TTL",
			Faults:   fmt.Sprintf("SIGSTOP of a client holding %d locks in one session (TTL %s) for %s", n, sessionTTL, secs(last-pausedAt)),
			Recovery: fmt.Sprintf("successor acquired the first lock %s and all %d %s after the pause", secs(first-pausedAt), n, secs(last-pausedAt)),
			Notes: fmt.Sprintf("every holding ended SessionExpired, seen held %s–%s past its safe deadline; the session was deleted; paused client's writes: %d accepted before, %d rejected as stale after resuming; %s",
				secs(minM), secs(maxM), accepted, stale, successorWrites(slowest))}, "s9")
	})

	It("10: the apiserver unreachable from a session client: each lock's Done fires by the session's safe deadline, before anyone re-acquires", func(ctx SpecContext) {
		const n = 5
		a, sess, keys, held := sessionHolder(ctx, "s10-a", "s10", n)
		b := newClient("s10-b")
		chs := blindWrites(a, keys, 150)
		Eventually(func() int { return len(fenceWrites(ctx, "s10")) }).Should(BeNumerically(">=", n))
		proxy.SetRule(func(r *http.Request) faultproxy.Action {
			if strings.HasPrefix(r.UserAgent(), "s10-a") {
				return faultproxy.Refuse
			}
			return faultproxy.Pass
		})
		DeferCleanup(func() { proxy.SetRule(nil) })
		cutAt := history.Mono()
		var doneAfter int64
		for _, r := range held {
			Eventually(func() int64 { return lostAt(a, r.Lease) }).WithTimeout(30 * time.Second).ShouldNot(BeZero())
			doneAfter = max(doneAfter, lostAt(a, r.Lease)-cutAt)
		}
		Expect(doneAfter).To(BeNumerically("<=", int64(sessionTTL)), "Done must fire within the session's TTL")
		first, last, slowest := takeOver(b, keys, held)
		proxy.SetRule(nil)
		accepted, stale := writeTotals(chs)
		minM, maxM := wrapUp(ctx, "s10", sess, a, b, keys, held)
		check(ctx, result{Scenario: "10 apiserver unreachable from a session client",
			Faults:   fmt.Sprintf("every request of a client holding %d locks in one session (TTL %s) refused by the proxy for %s", n, sessionTTL, secs(last-cutAt)),
			Recovery: fmt.Sprintf("successor acquired the first lock %s and all %d %s after the cut", secs(first-cutAt), n, secs(last-cutAt)),
			Notes: fmt.Sprintf("each lock's Done fired at most %s after the cut; every holding ended SessionExpired, seen held %s–%s past its safe deadline; the cut-off client's writes: %d accepted, %d rejected as stale; %s",
				secs(doneAfter), secs(minM), secs(maxM), accepted, stale, successorWrites(slowest))}, "s10")
	})

	It("11: the leader manager SIGKILLed while sessions lapse: the standby expires every holding, none before its safe deadline", func(ctx SpecContext) {
		holderOf := map[string]*lockClient{}
		var leases, sessions, keys []string
		var clients []*lockClient
		for i := range 3 {
			c, sess, ks, held := sessionHolder(ctx, fmt.Sprintf("s11-h%d", i), "s11", 3)
			for _, r := range held {
				holderOf[r.Lease] = c
			}
			leases, sessions, keys = append(leases, leasesOf(held)...), append(sessions, sess), append(keys, ks...)
			clients = append(clients, c)
		}
		old := waitLeader()
		for _, c := range clients {
			killClient(c) // the holders crash: their sessions now wait for the controller
		}
		time.Sleep(time.Second) // scheduled: kill the leader while the sessions are lapsing
		killedAt := old.kill()
		minM, maxM := expiredAfterDeadlines("s11", func(lease string) *lockClient { return holderOf[lease] }, leases)
		exp := obs.expiries("s11")
		first := int64(0)
		for _, lease := range leases {
			if t := exp[lease][0]; first == 0 || t < first {
				first = t
			}
		}
		for _, s := range sessions {
			sessionDeleted(ctx, s)
		}
		newLeader := waitLeader()
		tl := failoverTimeline(newLeader, killedAt)
		tl.markAt(first, "first expiry observed")
		tl.log("failover, from the kill of " + old.name)
		unwatch(keys...)
		check(ctx, result{Scenario: "11 leader killed while sessions lapse",
			Faults:   fmt.Sprintf("SIGKILL of the leader (%s) with 3 crashed session clients (3 locks each, TTL %s) awaiting expiry", old.name, sessionTTL),
			Recovery: fmt.Sprintf("%s from the kill to the first expiry (by %s)", secs(first-killedAt), newLeader.name),
			Notes:    fmt.Sprintf("all %d holdings ended SessionExpired, seen held %s–%s past their safe deadlines; all 3 sessions deleted", len(leases), secs(minM), secs(maxM))}, "s11")
	})
})
