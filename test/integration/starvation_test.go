package integration

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/suite"
)

// Writer starvation (adapted from Curator's testWriterAgainstConstantReaders,
// TestInterProcessReadWriteLockBase.java: 8 readers loop acquire, hold 100 ms,
// release, while a writer must get the lock 10 times within 10 s each): a
// continuous stream of overlapping readers never leaves an RWMutex free, so
// a writer gets it only because of FIFO across modes: once it is queued,
// readers that come later queue behind it, and it acquires as soon as the
// readers that held when it enqueued (one generation) have released.
//
// The stored object's own record says so: a watch sees every version of the
// lock; in the version where the writer's waiter entry first appears, the
// shared holders are its generation, and no version until the writer holds
// may show a reader that is not of it. The readers' own tokens say the same:
// a reader that acquired after the writer enqueued has a token above the
// resourceVersion of the enqueue, and below the writer's.
var _ = backends.Describe("writer starvation", Serial, func() {
	It("a writer behind a continuous stream of readers gets the lock within one generation of readers", func(ctx SpecContext) {
		const readers, attempts = 4, 8
		const hold = 300 * time.Millisecond
		ns := suite.Namespace(ctx)
		suite.NewLock(ctx, ns, "stream", locksv1alpha1.DistributedLockSpec{Type: locksv1alpha1.RWMutex})

		versions := watchVersions(ctx, ns)

		// The readers: acquire, hold, release, again, each as its own user.
		type readerAcq struct {
			lease string
			token int64
		}
		// The readers stop between holdings, never in the middle of an
		// acquire: an acquire cut short may have committed a holding that the
		// count below would miss.
		var (
			mu       sync.Mutex
			acqs     []readerAcq
			wg       sync.WaitGroup
			stopping atomic.Bool
		)
		stop := func() { stopping.Store(true); wg.Wait() }
		DeferCleanup(stop)
		for i, c := range recipeClients(ctx, ns, readers) {
			wg.Add(1)
			go func() {
				defer GinkgoRecover()
				defer wg.Done()
				// Stagger the readers so that their holdings overlap.
				time.Sleep(time.Duration(i) * hold / readers)
				for !stopping.Load() {
					l, err := c.Acquire(ctx, "stream", lock.WithShared(), lock.WithWaitTimeout(60*time.Second))
					Expect(err).NotTo(HaveOccurred(), "reader %d", i)
					mu.Lock()
					acqs = append(acqs, readerAcq{l.LeaseID(), l.FencingToken()})
					mu.Unlock()
					time.Sleep(hold) // the reader's work
					Expect(l.Release(ctx)).To(Succeed())
				}
			}()
		}

		type result struct {
			req                string
			wait               time.Duration
			token              int64
			enqueueRV          int64
			generation         []string
			queuedAhead        int
			storedAfter        []string // readers the store shows holding after the enqueue, not of the generation
			clientAfter        int      // reader acquisitions with a token between the enqueue and the writer's
			enqueuedToAcquired time.Duration
			drained            time.Duration // from the enqueue to the generation's last release
			conflicts          int           // the writer's writes that lost a race with the readers'
		}
		var results []result
		writerMetrics := prometheus.NewRegistry()
		writer, _ := suite.NewClient(ctx, ns, lock.WithMetrics(writerMetrics))
		for a := range attempts {
			// Start each attempt behind a live generation and an empty queue.
			Eventually(func(g Gomega) {
				st := suite.GetLock(ctx, ns, "stream").Status
				g.Expect(len(st.SharedHolders)).To(BeNumerically(">=", 2))
				g.Expect(st.Waiters).To(BeEmpty())
			}, 30*time.Second).Should(Succeed(), "attempt %d: the readers do not overlap", a)
			req := fmt.Sprintf("writer-%d", a)
			conflictsBefore := conflicts(writerMetrics)
			began := time.Now()
			l, err := writer.Acquire(ctx, "stream", lock.WithRequestID(req), lock.WithWaitTimeout(30*time.Second))
			Expect(err).NotTo(HaveOccurred(), "attempt %d: the writer starved", a)
			results = append(results, result{req: req, wait: time.Since(began), token: l.FencingToken(), conflicts: conflicts(writerMetrics) - conflictsBefore})
			Expect(l.Release(ctx)).To(Succeed())
		}
		stop()

		// Read the store's record, once the watch has delivered the last
		// release, and the readers' tokens.
		mu.Lock()
		defer mu.Unlock()
		total := int64(len(acqs) + attempts)
		Eventually(func(g Gomega) {
			last := versions.last()
			g.Expect(last).NotTo(BeNil())
			g.Expect(last.Status.Transitions).To(Equal(total))
			g.Expect(last.IsHeld()).To(BeFalse())
		}).Should(Succeed(), "the watch did not see every acquisition and the last release")
		vs := versions.stop()
		for i := range results {
			r := &results[i]
			enq := slices.IndexFunc(vs, func(v storedVersion) bool { return v.obj.Status.WaiterIndex(r.req) >= 0 })
			Expect(enq).To(BeNumerically(">=", 0), "the watch never saw writer %s queued", r.req)
			got := slices.IndexFunc(vs, func(v storedVersion) bool {
				h := v.obj.Status.Holder
				return h != nil && h.RequestID == r.req
			})
			Expect(got).To(BeNumerically(">", enq), "the watch never saw writer %s hold", r.req)
			st := vs[enq].obj.Status
			r.enqueueRV = rv(vs[enq].obj)
			r.queuedAhead = st.WaiterIndex(r.req)
			r.enqueuedToAcquired = vs[got].seen.Sub(vs[enq].seen)
			drained := enq + slices.IndexFunc(vs[enq:], func(v storedVersion) bool { return len(v.obj.Status.SharedHolders) == 0 })
			r.drained = vs[drained].seen.Sub(vs[enq].seen)
			for _, h := range st.SharedHolders {
				r.generation = append(r.generation, h.LeaseID)
			}
			for _, v := range vs[enq:got] {
				for _, h := range v.obj.Status.SharedHolders {
					if !slices.Contains(r.generation, h.LeaseID) && !slices.Contains(r.storedAfter, h.LeaseID) {
						r.storedAfter = append(r.storedAfter, h.LeaseID)
					}
				}
			}
			for _, a := range acqs {
				if a.token > r.enqueueRV && a.token < r.token {
					r.clientAfter++
				}
			}
		}

		var waits []time.Duration
		var lines []string
		for i, r := range results {
			waits = append(waits, r.wait)
			lines = append(lines, fmt.Sprintf("attempt %d: waited %s (enqueued to acquired %s: the generation released in %s, hand-off %s; %d of its writes lost a race), generation of %d readers, %d queued ahead, readers acquired after it enqueued: %d stored, %d by token",
				i, r.wait.Round(time.Millisecond), r.enqueuedToAcquired.Round(time.Millisecond), r.drained.Round(time.Millisecond), (r.enqueuedToAcquired-r.drained).Round(time.Millisecond), r.conflicts, len(r.generation), r.queuedAhead, len(r.storedAfter), r.clientAfter))
		}
		sort.Slice(waits, func(i, j int) bool { return waits[i] < waits[j] })
		report := fmt.Sprintf("%d readers holding %s each in a loop (%d reader acquisitions), %d writer attempts: writer wait median %s, max %s (a reader's hold is %s)\n%s",
			readers, hold, len(acqs), attempts, waits[len(waits)/2].Round(time.Millisecond), waits[len(waits)-1].Round(time.Millisecond), hold, strings.Join(lines, "\n"))
		AddReportEntry("starvation", report)
		GinkgoWriter.Println(report)

		for i, r := range results {
			Expect(r.queuedAhead).To(BeZero(), "attempt %d: the writer was not the head when it enqueued", i)
			Expect(r.generation).NotTo(BeEmpty(), "attempt %d: no readers held when the writer enqueued", i)
			Expect(r.storedAfter).To(BeEmpty(), "attempt %d: readers acquired after the writer enqueued (the store's record)", i)
			Expect(r.clientAfter).To(BeZero(), "attempt %d: readers acquired after the writer enqueued (their tokens)", i)
		}
	})
})

// storedVersion is one version of a lock a watch delivered, and when.
type storedVersion struct {
	obj  *locksv1alpha1.DistributedLock
	seen time.Time
}

type versionWatch struct {
	mu       sync.Mutex
	versions []storedVersion
	cancel   context.CancelFunc
	done     chan struct{}
}

// watchVersions records every version of the locks in ns until stop.
func watchVersions(ctx context.Context, ns string) *versionWatch {
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	Expect(err).NotTo(HaveOccurred())
	wctx, cancel := context.WithCancel(ctx)
	w, err := wc.Watch(wctx, &locksv1alpha1.DistributedLockList{}, client.InNamespace(ns))
	Expect(err).NotTo(HaveOccurred())
	vw := &versionWatch{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(vw.done)
		defer w.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case ev, ok := <-w.ResultChan():
				if !ok {
					return
				}
				if l, isLock := ev.Object.(*locksv1alpha1.DistributedLock); isLock {
					vw.mu.Lock()
					vw.versions = append(vw.versions, storedVersion{l, time.Now()})
					vw.mu.Unlock()
				}
			}
		}
	}()
	DeferCleanup(cancel)
	return vw
}

func (vw *versionWatch) last() *locksv1alpha1.DistributedLock {
	vw.mu.Lock()
	defer vw.mu.Unlock()
	if len(vw.versions) == 0 {
		return nil
	}
	return vw.versions[len(vw.versions)-1].obj
}

// stop ends the watch and returns what it saw, checking it missed no
// acquisition: a write makes at most one, so status.transitions rises by at
// most one from one version to the next.
func (vw *versionWatch) stop() []storedVersion {
	vw.cancel()
	<-vw.done
	vw.mu.Lock()
	defer vw.mu.Unlock()
	for i := 1; i < len(vw.versions); i++ {
		prev, cur := vw.versions[i-1].obj, vw.versions[i].obj
		Expect(cur.Status.Transitions-prev.Status.Transitions).To(BeElementOf(int64(0), int64(1)),
			"versions %s and %s: transitions %d then %d (a version missed, or two acquisitions in one write)", prev.ResourceVersion, cur.ResourceVersion, prev.Status.Transitions, cur.Status.Transitions)
	}
	return vw.versions
}

// conflicts is the client's kubelock_client_conflicts_total, all operations.
func conflicts(reg *prometheus.Registry) int {
	mfs, err := reg.Gather()
	Expect(err).NotTo(HaveOccurred())
	n := 0.0
	for _, mf := range mfs {
		if mf.GetName() == "kubelock_client_conflicts_total" {
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return int(n)
}

func rv(l *locksv1alpha1.DistributedLock) int64 {
	n, err := strconv.ParseInt(l.ResourceVersion, 10, 64)
	Expect(err).NotTo(HaveOccurred())
	return n
}
