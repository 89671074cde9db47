package integration

import (
	"context"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/suite"
)

// multiLockRun is how long the no-deadlock spec runs: 60 s, or
// KUBELOCK_MULTILOCK_SECONDS.
func multiLockRun() time.Duration {
	if s, err := strconv.Atoi(os.Getenv("KUBELOCK_MULTILOCK_SECONDS")); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	return 60 * time.Second
}

var _ = backends.Describe("multi-lock (AcquireAll)", func() {
	ctx := context.Background()
	var ns string
	suite.NamespaceEach(&ns, "a", "b")

	It("never deadlocks two clients taking {a, b} and {b, a}, round after round", func() {
		const roundTimeout = 10 * time.Second
		run := multiLockRun()
		var (
			inside   atomic.Int32 // holders of both locks at once: never more than one
			rounds   [2]int
			slowest  [2]time.Duration
			wg       sync.WaitGroup
			stopAt   = time.Now().Add(run)
			keySets  = [2][]string{{"a", "b"}, {"b", "a"}}
			failures atomic.Int32
		)
		for i := range 2 {
			c, _ := suite.NewClient(ctx, ns)
			wg.Go(func() {
				defer GinkgoRecover()
				for time.Now().Before(stopAt) && failures.Load() == 0 {
					start := time.Now()
					ls, err := c.AcquireAll(ctx, keySets[i], lock.WithWaitTimeout(roundTimeout))
					if err != nil {
						failures.Add(1)
					}
					Expect(err).NotTo(HaveOccurred(), "client %d, round %d", i, rounds[i]+1)
					Expect(inside.Add(1)).To(Equal(int32(1)), "both clients hold {a, b} at once")
					inside.Add(-1)
					Expect(ls.Release(ctx)).To(Succeed())
					took := time.Since(start)
					Expect(took).To(BeNumerically("<", roundTimeout), "a round exceeded its timeout")
					rounds[i]++
					slowest[i] = max(slowest[i], took)
				}
			})
		}
		wg.Wait()
		total, worst := rounds[0]+rounds[1], max(slowest[0], slowest[1])
		AddReportEntry("multi-lock rounds", ReportEntryVisibilityAlways,
			struct {
				Seconds        float64
				Rounds         [2]int
				Total          int
				MaxRoundMillis int64
			}{run.Seconds(), rounds, total, worst.Milliseconds()})
		GinkgoWriter.Printf("multi-lock: %d rounds in %s (client 1: %d, client 2: %d), slowest round %s\n",
			total, run, rounds[0], rounds[1], worst)
		Expect(rounds[0]).To(BeNumerically(">", 0))
		Expect(rounds[1]).To(BeNumerically(">", 0))
		for _, name := range []string{"a", "b"} {
			stored := suite.GetLock(ctx, ns, name)
			Expect(stored.Status.Holder).To(BeNil())
			Expect(stored.Status.Waiters).To(BeEmpty())
		}
	})

	It("acquires in canonical order whatever the order of the keys, and returns them in the order given", func() {
		c, _ := suite.NewClient(ctx, ns)
		ls, err := c.AcquireAll(ctx, []string{"b", "a"})
		Expect(err).NotTo(HaveOccurred())
		held := ls.Locks()
		Expect(held).To(HaveLen(2))
		Expect(held[0].Key()).To(Equal("b"))
		Expect(held[1].Key()).To(Equal("a"))
		Expect(held[1].FencingToken()).To(BeNumerically("<", held[0].FencingToken()), "a was taken first")
		Expect(ls.Release(ctx)).To(Succeed())
		Expect(ls.Done()).To(BeClosed())
		Expect(ls.Err()).To(MatchError(lock.ErrReleased))
		for _, name := range []string{"a", "b"} {
			Expect(suite.GetLock(ctx, ns, name).Status.Holder).To(BeNil())
		}

		_, err = c.AcquireAll(ctx, []string{"a", "a"})
		Expect(err).To(MatchError(ContainSubstring("name the same lock")))
	})

	It("releases everything it took when the overall timeout runs out", func() {
		x, _ := suite.NewClient(ctx, ns)
		xb, err := x.Acquire(ctx, "b")
		Expect(err).NotTo(HaveOccurred())

		y, yUser := suite.NewClient(ctx, ns)
		start := time.Now()
		_, err = y.AcquireAll(ctx, []string{"b", "a"}, lock.WithWaitTimeout(2*time.Second))
		Expect(err).To(MatchError(lock.ErrTimeout))
		Expect(time.Since(start)).To(BeNumerically("<", 2*time.Second+time.Second), "one bound for the whole call")

		a := suite.GetLock(ctx, ns, "a")
		Expect(a.Status.Holder).To(BeNil(), "a, taken first, was released")
		Expect(a.Status.Transitions).To(Equal(int64(1)))
		Expect(a.Status.RecentAcquisitions).To(HaveLen(1))
		Expect(a.Status.RecentAcquisitions[0].EndReason).To(Equal(locksv1alpha1.EndReasonReleased))
		Expect(a.Status.RecentAcquisitions[0].EndedBy).To(Equal(yUser))
		b := suite.GetLock(ctx, ns, "b")
		Expect(b.Status.Holder.LeaseID).To(Equal(xb.LeaseID()), "b stays with its holder")
		Expect(b.Status.Waiters).To(BeEmpty(), "y left b's queue")
		Expect(xb.Release(ctx)).To(Succeed())
	})

	It("fires one Done when any of the locks is lost", func() {
		y, _ := suite.NewClient(ctx, ns)
		ls, err := y.AcquireAll(ctx, []string{"a", "b"})
		Expect(err).NotTo(HaveOccurred())
		forceRelease(ctx, ns, "b", "test")
		Consistently(ls.Done(), 200*time.Millisecond).ShouldNot(BeClosed(), "nothing is known before the holder learns it")

		b := ls.Locks()[1]
		Expect(b.Renew(ctx)).To(MatchError(lock.ErrLockLost)) // as the background renewal would, sooner
		Eventually(ls.Done()).Should(BeClosed())
		Expect(ls.Err()).To(MatchError(lock.ErrLockLost))
		a := ls.Locks()[0]
		Expect(a.Err()).NotTo(HaveOccurred(), "the other lock is held until Release")

		err = ls.Release(ctx)
		Expect(err).To(MatchError(lock.ErrLockLost))
		Expect(err.Error()).To(ContainSubstring("b:"))
		Expect(suite.GetLock(ctx, ns, "a").Status.Holder).To(BeNil())
	})
})
