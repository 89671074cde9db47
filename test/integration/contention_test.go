package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/suite"
)

// holding is one client's confirmed interval of holding, by this process's
// monotonic clock: from Acquire's return to the moment it sent its release or
// learned that the lock was lost.
type holding struct {
	client     int
	token      int64
	start, end time.Time
	crashed    bool
	// releaseLost: the holding expired before its release landed.
	releaseLost bool
}

var _ = backends.Describe("many clients on one lock", Serial, func() {
	It("never lets holding intervals overlap (I1) and issues increasing tokens (I2)", func() {
		ctx := context.Background()
		ns := suite.Namespace(ctx)
		suite.NewLock(ctx, ns, "hot", locksv1alpha1.DistributedLockSpec{LeaseDurationSeconds: 4, HandoffTimeoutSeconds: 2})

		const clients = 32
		duration := 20 * time.Second
		seed := time.Now().UnixNano()
		GinkgoWriter.Printf("contention seed %d\n", seed)

		var (
			mu        sync.Mutex
			holdings  []holding
			latencies []time.Duration
			wg        sync.WaitGroup
		)
		end := time.Now().Add(duration)
		for i := range clients {
			// A crash is a holding of a client that never renews, abandoned
			// without release; the controller must expire it.
			c, _ := suite.NewClient(ctx, ns)
			crashy, _ := suite.NewClient(ctx, ns, lock.WithoutAutoRenew())
			rng := rand.New(rand.NewPCG(uint64(seed), uint64(i)))
			wg.Add(1)
			go func() {
				defer GinkgoRecover()
				defer wg.Done()
				for time.Now().Before(end) {
					crash := rng.IntN(100) == 0
					cl := c
					if crash {
						cl = crashy
					}
					began := time.Now()
					l, err := cl.Acquire(ctx, "hot", lock.WithWaitTimeout(time.Minute))
					Expect(err).NotTo(HaveOccurred())
					h := holding{client: i, token: l.FencingToken(), start: time.Now()}
					// Hold briefly; now and then crash: stop without releasing
					// and let the controller expire the lease.
					time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
					if crash {
						<-l.Done()
						h.end, h.crashed = time.Now(), true
					} else {
						h.end = time.Now()
						// On a loaded machine a release can wait behind conflicting
						// queue writes for longer than the lease; the controller then
						// expires the holding and the client says it was lost (I5).
						// Both are correct; the work ended at h.end either way.
						if err := l.Release(ctx); err != nil {
							Expect(err).To(MatchError(lock.ErrLockLost))
							h.releaseLost = true
						}
					}
					mu.Lock()
					holdings = append(holdings, h)
					latencies = append(latencies, h.start.Sub(began))
					mu.Unlock()
				}
			}()
		}
		wg.Wait()

		sort.Slice(holdings, func(i, j int) bool { return holdings[i].start.Before(holdings[j].start) })
		crashes, releaseLost := 0, 0
		for i, h := range holdings {
			if h.crashed {
				crashes++
			}
			if h.releaseLost {
				releaseLost++
			}
			if i == 0 {
				continue
			}
			prev := holdings[i-1]
			Expect(h.start.After(prev.end)).To(BeTrue(), "holding %d (client %d, token %d) began before holding %d (client %d, token %d) ended", i, h.client, h.token, i-1, prev.client, prev.token)
			Expect(h.token).To(BeNumerically(">", prev.token), "tokens must increase in hold order")
		}
		Expect(holdings).NotTo(BeEmpty())
		stored := suite.GetLock(ctx, ns, "hot")
		Expect(stored.Status.Transitions).To(Equal(int64(len(holdings))), "every acquisition is one recorded transition")

		slices.Sort(latencies)
		pct := func(p float64) time.Duration { return latencies[int(p*float64(len(latencies)-1))] }
		report := fmt.Sprintf("%d clients, %s: %d holdings (%d crashed, %d expired before their release landed), %.1f holdings/s; acquire latency p50 %s p95 %s p99 %s max %s",
			clients, duration, len(holdings), crashes, releaseLost, float64(len(holdings))/duration.Seconds(),
			pct(0.50).Round(time.Millisecond), pct(0.95).Round(time.Millisecond), pct(0.99).Round(time.Millisecond), latencies[len(latencies)-1].Round(time.Millisecond))
		AddReportEntry("contention", report)
		GinkgoWriter.Println(report)
	})
})
