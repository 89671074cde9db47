package integration

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/suite"
)

// Scenarios of other lock libraries' own test suites, run against RWMutex and
// Semaphore locks on the real apiserver with the webhook and the controller:
// etcd's RWMutex recipe test (tests/integration/clientv3/experimental/recipes/
// v3_lock_test.go) and Curator's read-write lock and semaphore tests
// (curator-recipes/src/test/java/org/apache/curator/framework/recipes/locks/
// TestInterProcessReadWriteLockBase.java and TestInterProcessSemaphore.java).
// Each spec names the test it is adapted from. Every participant is a client
// of its own user, as the libraries' tests give each participant its own
// session or connection.

// occupancy counts the confirmed holdings of one lock as their clients see
// them (from Acquire's return to Release's call), as Curator's tests do with
// their concurrentCount/Counter, and remembers the most at once.
type occupancy struct {
	mu                  sync.Mutex
	readers, writers    int
	mostReaders, most   int
	violations          []string
	readUses, writeUses int
}

// enter records a holding that began; a writer must be alone, a reader must
// have no writer beside it, and nobody may exceed limit.
func (o *occupancy) enter(writer bool, limit int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if writer {
		o.writers++
		o.writeUses++
	} else {
		o.readers++
		o.readUses++
	}
	switch {
	case o.writers > 1 || (o.writers == 1 && o.readers > 0):
		o.violations = append(o.violations, fmt.Sprintf("%d writers and %d readers at once", o.writers, o.readers))
	case o.readers+o.writers > limit:
		o.violations = append(o.violations, fmt.Sprintf("%d holders at once, limit %d", o.readers+o.writers, limit))
	}
	o.mostReaders = max(o.mostReaders, o.readers)
	o.most = max(o.most, o.readers+o.writers)
}

func (o *occupancy) leave(writer bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if writer {
		o.writers--
	} else {
		o.readers--
	}
}

func (o *occupancy) now() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.readers + o.writers
}

func recipeClients(ctx context.Context, ns string, n int, opts ...lock.Option) []*lock.Client {
	out := make([]*lock.Client, n)
	for i := range out {
		out[i], _ = suite.NewClient(ctx, ns, opts...)
	}
	return out
}

// recipeSemaphore is a Semaphore's spec.
func recipeSemaphore(permits int32) locksv1alpha1.DistributedLockSpec {
	return locksv1alpha1.DistributedLockSpec{Type: locksv1alpha1.Semaphore, Permits: int32p(permits)}
}

// permitHolders starts a holder per client that takes a permit of the
// Semaphore "sem", counts itself in occ while it holds, runs hold, and
// returns the permit; the WaitGroup is done when all have.
func permitHolders(ctx context.Context, clients []*lock.Client, permits int, occ *occupancy, hold func()) *sync.WaitGroup {
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Add(1)
		go func() {
			defer GinkgoRecover()
			defer wg.Done()
			l, err := c.Acquire(ctx, "sem", lock.WithWaitTimeout(120*time.Second))
			Expect(err).NotTo(HaveOccurred())
			occ.enter(false, permits)
			hold()
			occ.leave(false)
			Expect(l.Release(ctx)).To(Succeed())
		}()
	}
	return &wg
}

// queued reports whether requestID waits in the stored queue of lock name.
func queued(ctx context.Context, ns, name, requestID string) bool {
	return suite.GetLock(ctx, ns, name).Status.WaiterIndex(requestID) >= 0
}

var _ = backends.Describe("recipes of other lock libraries: RWMutex", func() {
	var ns string
	suite.NamespaceEach(&ns)

	// etcd's testRWMutex: five waiters take the lock at random as readers or
	// the writer; the test takes each acquisition as it arrives, checks that
	// a writer's arrived alone and a reader's with no writer beside it, and
	// releases it. Here also against the stored object, in several rounds.
	It("a writer excludes everyone, readers exclude no reader (etcd testRWMutex)", func(ctx SpecContext) {
		suite.NewLock(ctx, ns, "rw", locksv1alpha1.DistributedLockSpec{Type: locksv1alpha1.RWMutex})
		const waiters, rounds = 5, 4
		seed := time.Now().UnixNano()
		rng := rand.New(rand.NewPCG(uint64(seed), 1))
		GinkgoWriter.Printf("seed %d\n", seed)
		clients := recipeClients(ctx, ns, waiters)
		for round := range rounds {
			type got struct {
				l      *lock.Lock
				writer bool
			}
			locked := make(chan got, waiters)
			for i, c := range clients {
				writer := rng.IntN(2) == 0
				go func() {
					defer GinkgoRecover()
					var opts []lock.AcquireOption
					if !writer {
						opts = append(opts, lock.WithShared())
					}
					l, err := c.Acquire(ctx, "rw", append(opts, lock.WithWaitTimeout(30*time.Second))...)
					Expect(err).NotTo(HaveOccurred(), "round %d, waiter %d (writer %v)", round, i, writer)
					locked <- got{l, writer}
				}()
			}
			for received := 0; received < waiters; {
				var first got
				Eventually(locked, 30*time.Second).Should(Receive(&first), "round %d: nobody acquired", round)
				batch := []got{first}
				stored := suite.GetLock(ctx, ns, "rw")
				if first.writer {
					Expect(stored.Status.Holder).NotTo(BeNil(), "round %d: the writer's holding is not stored", round)
					Expect(stored.Status.Holder.LeaseID).To(Equal(first.l.LeaseID()))
					Expect(stored.Status.SharedHolders).To(BeEmpty(), "round %d: readers stored beside the writer", round)
					// etcd: "readers did not wait" — nobody else got in.
					Expect(locked).NotTo(Receive(), "round %d: someone acquired while the writer held", round)
				} else {
					// Every reader the store shows arrives; none is a writer.
					Expect(stored.Status.Holder).To(BeNil(), "round %d: a writer stored beside a reader", round)
					for len(batch) < len(stored.Status.SharedHolders) {
						var g got
						Eventually(locked, 30*time.Second).Should(Receive(&g))
						Expect(g.writer).To(BeFalse(), "round %d: a writer acquired while %d readers held", round, len(batch))
						batch = append(batch, g)
					}
					for _, g := range batch {
						Expect(stored.Status.SharedIndex(g.l.LeaseID())).To(BeNumerically(">=", 0), "round %d: reader %s is not stored", round, g.l.LeaseID())
					}
				}
				for _, g := range batch {
					Expect(g.l.Release(ctx)).To(Succeed())
				}
				received += len(batch)
			}
			Eventually(func() bool { return suite.GetLock(ctx, ns, "rw").IsHeld() }).Should(BeFalse(), "round %d left the lock held", round)
		}
	})

	// Curator's testBasic: 8 clients, 100 iterations each, a writer one time
	// in ten, each holding 1–9 ms; a writer must be alone, and readers must
	// have been seen together (maxConcurrentCount > 1). Scaled to 6 clients
	// and 12 iterations for a 2-core machine, and the holds to 20–200 ms: a
	// status write here takes tens of milliseconds, not ZooKeeper's one, so
	// readers holding 1–9 ms between two writes never overlap.
	It("readers hold together and a writer holds alone, under load (Curator testBasic)", func(ctx SpecContext) {
		suite.NewLock(ctx, ns, "rw", locksv1alpha1.DistributedLockSpec{Type: locksv1alpha1.RWMutex})
		const concurrency, iterations = 6, 12
		var occ occupancy
		var wg sync.WaitGroup
		for i, c := range recipeClients(ctx, ns, concurrency) {
			wg.Add(1)
			go func() {
				defer GinkgoRecover()
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(i)))
				for range iterations {
					writer := rng.IntN(100) < 10
					var opts []lock.AcquireOption
					if !writer {
						opts = append(opts, lock.WithShared())
					}
					l, err := c.Acquire(ctx, "rw", append(opts, lock.WithWaitTimeout(30*time.Second))...)
					Expect(err).NotTo(HaveOccurred())
					occ.enter(writer, locksv1alpha1.MaxSharedHolders)
					time.Sleep(time.Duration(20+rng.IntN(180)) * time.Millisecond) // the work done while holding
					occ.leave(writer)
					Expect(l.Release(ctx)).To(Succeed())
				}
			}()
		}
		wg.Wait()
		GinkgoWriter.Printf("writes %d, reads %d, most readers at once %d\n", occ.writeUses, occ.readUses, occ.mostReaders)
		Expect(occ.violations).To(BeEmpty())
		Expect(occ.readUses + occ.writeUses).To(Equal(concurrency * iterations))
		Expect(occ.mostReaders).To(BeNumerically(">", 1), "readers never held together")
	})

	// etcd's RWMutex recipe: RLock waits only for writers queued before it.
	// Five readers take the lock one after another without anyone
	// releasing; each TryAcquire succeeds at once.
	It("readers never block readers (etcd recipe RLock)", func(ctx SpecContext) {
		suite.NewLock(ctx, ns, "rw", locksv1alpha1.DistributedLockSpec{Type: locksv1alpha1.RWMutex})
		var held []*lock.Lock
		for i, c := range recipeClients(ctx, ns, 5) {
			l, err := c.TryAcquire(ctx, "rw", lock.WithShared())
			Expect(err).NotTo(HaveOccurred(), "reader %d was blocked by %d readers", i, len(held))
			held = append(held, l)
		}
		stored := suite.GetLock(ctx, ns, "rw")
		Expect(stored.Status.SharedHolders).To(HaveLen(5))
		Expect(stored.Status.HolderCount).To(Equal(int32(5)))
		slots := map[int32]bool{}
		for i, l := range held {
			slot, ok := l.Slot()
			Expect(ok).To(BeTrue())
			slots[slot] = true
			if i > 0 {
				Expect(l.FencingToken()).To(BeNumerically(">", held[i-1].FencingToken()))
			}
		}
		Expect(slots).To(HaveLen(5), "five readers on five slots")
		// A writer now cannot get in, and says who holds.
		w, _ := suite.NewClient(ctx, ns)
		_, err := w.TryAcquire(ctx, "rw")
		var locked *lock.LockedError
		Expect(errors.As(err, &locked)).To(BeTrue(), "got %v", err)
		Expect(locked.Shared).To(Equal(5))
		for _, l := range held {
			Expect(l.Release(ctx)).To(Succeed())
		}
		_, err = w.TryAcquire(ctx, "rw")
		Expect(err).NotTo(HaveOccurred())
	})

	// Curator's testOrdering: readers 1–3 hold; writer 4 must wait for them;
	// readers 5 and 6, writer 7 and reader 8 queue behind it. After 1–3
	// release only 4 holds; after 4, readers 5 and 6 hold together; then 7
	// alone; then 8. Where Curator sleeps "a bit" to let a waiter queue, this
	// waits until the waiter is in the stored queue.
	It("FIFO across modes: a writer holds back the readers behind it (Curator testOrdering)", func(ctx SpecContext) {
		suite.NewLock(ctx, ns, "rw", locksv1alpha1.DistributedLockSpec{Type: locksv1alpha1.RWMutex})
		clients := recipeClients(ctx, ns, 8)
		writer := map[int]bool{4: true, 7: true}
		results := map[int]chan *lock.Lock{}
		start := func(i int) {
			results[i] = make(chan *lock.Lock, 1)
			req := fmt.Sprintf("ordering-%d", i)
			opts := []lock.AcquireOption{lock.WithRequestID(req), lock.WithWaitTimeout(60 * time.Second)}
			if !writer[i] {
				opts = append(opts, lock.WithShared())
			}
			go func() {
				defer GinkgoRecover()
				l, err := clients[i-1].Acquire(ctx, "rw", opts...)
				Expect(err).NotTo(HaveOccurred(), "locker %d", i)
				results[i] <- l
			}()
			if i > 3 {
				Eventually(func() bool { return queued(ctx, ns, "rw", req) }).Should(BeTrue(), "locker %d never queued", i)
			}
		}
		holds := map[int]*lock.Lock{}
		expectHolding := func(want ...int) {
			GinkgoHelper()
			for _, i := range want {
				if holds[i] != nil {
					continue
				}
				var l *lock.Lock
				Eventually(results[i], 30*time.Second).Should(Receive(&l), "locker %d did not acquire", i)
				holds[i] = l
			}
			for i, ch := range results {
				if !slices.Contains(want, i) && holds[i] == nil {
					Expect(ch).NotTo(Receive(), "locker %d acquired out of turn; holding should be %v", i, want)
				}
			}
			stored := suite.GetLock(ctx, ns, "rw")
			Expect(countAcquired(stored)).To(Equal(len(want)), "stored holdings: holder %v, %d shared", stored.Status.Holder, len(stored.Status.SharedHolders))
		}
		release := func(is ...int) {
			GinkgoHelper()
			for _, i := range is {
				Expect(holds[i].Release(ctx)).To(Succeed())
			}
		}
		for i := 1; i <= 3; i++ {
			start(i)
		}
		expectHolding(1, 2, 3)
		start(4)
		expectHolding(1, 2, 3) // the writer does not succeed yet
		for _, i := range []int{5, 6, 7, 8} {
			start(i)
		}
		var modes []locksv1alpha1.Mode
		for _, w := range suite.GetLock(ctx, ns, "rw").Status.Waiters {
			modes = append(modes, w.Mode)
		}
		Expect(modes).To(Equal([]locksv1alpha1.Mode{locksv1alpha1.Exclusive, locksv1alpha1.Shared, locksv1alpha1.Shared, locksv1alpha1.Exclusive, locksv1alpha1.Shared}))
		release(1, 2, 3)
		expectHolding(4) // new readers and writers do not succeed yet
		release(4)
		expectHolding(5, 6) // only the two readers next
		release(5, 6)
		expectHolding(7) // now the writer
		release(7)
		expectHolding(8) // the last reader
		release(8)
	})
})

// countAcquired is how many holdings the stored lock has.
func countAcquired(l *locksv1alpha1.DistributedLock) int {
	n := len(l.Status.SharedHolders)
	if l.Status.Holder != nil {
		n++
	}
	return n
}

var _ = backends.Describe("recipes of other lock libraries: Semaphore", func() {
	var ns string
	suite.NamespaceEach(&ns)

	// Curator's testSimple2: with 3 leases, three acquire, a fourth does not
	// get one; once one is returned, the fourth does.
	It("the permits, and no more (Curator testSimple2)", func(ctx SpecContext) {
		suite.NewLock(ctx, ns, "sem", recipeSemaphore(3))
		clients := recipeClients(ctx, ns, 4)
		var held []*lock.Lock
		for _, c := range clients[:3] {
			l, err := c.TryAcquire(ctx, "sem")
			Expect(err).NotTo(HaveOccurred())
			held = append(held, l)
		}
		_, err := clients[3].TryAcquire(ctx, "sem")
		var locked *lock.LockedError
		Expect(errors.As(err, &locked)).To(BeTrue(), "a fourth permit of three: %v", err)
		Expect(locked.Shared).To(Equal(3))
		freed, _ := held[1].Slot()
		Expect(held[1].Release(ctx)).To(Succeed())
		l, err := clients[3].TryAcquire(ctx, "sem")
		Expect(err).NotTo(HaveOccurred())
		slot, _ := l.Slot()
		Expect(slot).To(Equal(freed), "the returned permit's slot is the lowest free one")
		Expect(l.FencingToken()).To(BeNumerically(">", held[2].FencingToken()), "the slot's next token is above every token before")
	})

	// Curator's testRelease1AtATime: 10 clients, 5 leases; each acquires,
	// counts itself, holds and returns its lease. All 10 get a lease, and
	// exactly 5 held at once at the most. Curator holds "a bit" and hopes
	// the first five overlap; here the first five hold until all five do.
	It("never more than N permits at once, and all N used (Curator testRelease1AtATime)", func(ctx SpecContext) {
		const clientQty, permits = 10, 5
		suite.NewLock(ctx, ns, "sem", recipeSemaphore(permits))
		var occ occupancy
		full := make(chan struct{})
		var once sync.Once
		permitHolders(ctx, recipeClients(ctx, ns, clientQty), permits, &occ, func() {
			if occ.now() == permits {
				once.Do(func() { close(full) })
			}
			Eventually(full, 60*time.Second).Should(BeClosed())
		}).Wait()
		Expect(occ.violations).To(BeEmpty())
		Expect(occ.readUses).To(Equal(clientQty))
		Expect(occ.most).To(Equal(permits))
	})

	// Curator's testReleaseInChunks: 100 threads, 11 leases; every holder
	// waits on a stepper that the test counts down by 1–5 at a time at
	// random intervals; never more than 11 held. Scaled to 20 clients and 5
	// permits; the stored object is read after every chunk as well.
	It("never more than N permits while holders leave in chunks (Curator testReleaseInChunks)", func(ctx SpecContext) {
		const threads, permits = 20, 5
		suite.NewLock(ctx, ns, "sem", recipeSemaphore(permits))
		var occ occupancy
		stepper := make(chan struct{}, threads)
		wg := permitHolders(ctx, recipeClients(ctx, ns, threads), permits, &occ, func() {
			Eventually(stepper, 120*time.Second).Should(Receive())
		})
		rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 2))
		for remaining := threads; remaining > 0; {
			times := min(1+rng.IntN(5), remaining)
			// Let a chunk go once the permits are taken (or all that are left).
			Eventually(occ.now, 60*time.Second).Should(Equal(min(permits, remaining)))
			stored := suite.GetLock(ctx, ns, "sem")
			Expect(len(stored.Status.SharedHolders)).To(BeNumerically("<=", permits))
			for range times {
				stepper <- struct{}{}
			}
			remaining -= times
		}
		wg.Wait()
		Expect(occ.violations).To(BeEmpty())
		Expect(occ.readUses).To(Equal(threads))
		Expect(occ.most).To(Equal(permits))
	})

	// Curator's testThreadedLeaseIncrease: with one lease held, a second
	// acquire waits; raising the count to 2 lets it through without the
	// first returning its lease. Here the administrator raises spec.permits.
	It("a waiter gets a permit when permits grow (Curator testThreadedLeaseIncrease)", func(ctx SpecContext) {
		suite.NewLock(ctx, ns, "sem", recipeSemaphore(1))
		clients := recipeClients(ctx, ns, 2)
		first, err := clients[0].Acquire(ctx, "sem")
		Expect(err).NotTo(HaveOccurred())
		second := make(chan *lock.Lock, 1)
		go func() {
			defer GinkgoRecover()
			l, err := clients[1].Acquire(ctx, "sem", lock.WithRequestID("second"), lock.WithWaitTimeout(30*time.Second))
			Expect(err).NotTo(HaveOccurred())
			second <- l
		}()
		Eventually(func() bool { return queued(ctx, ns, "sem", "second") }).Should(BeTrue())
		Expect(second).NotTo(Receive())
		obj := suite.GetLock(ctx, ns, "sem")
		obj.Spec.Permits = int32p(2)
		Expect(env.Client.Update(ctx, obj)).To(Succeed())
		var l *lock.Lock
		Eventually(second, 15*time.Second).Should(Receive(&l))
		Expect(first.Err()).NotTo(HaveOccurred(), "the first lease is still held")
		slot, _ := l.Slot()
		Expect(slot).To(Equal(int32(1)))
	})

	// Curator's testClientClose: a client that goes away gives its lease
	// back, and another gets it. A kubelock client that stops renewing loses
	// its permit when the controller expires it; the waiter then gets it.
	It("a crashed holder's permit goes to a waiter after expiry (Curator testClientClose)", func(ctx SpecContext) {
		spec := recipeSemaphore(1)
		spec.LeaseDurationSeconds = 1
		suite.NewLock(ctx, ns, "sem", spec)
		crashed, _ := suite.NewClient(ctx, ns, lock.WithoutAutoRenew())
		waiter, _ := suite.NewClient(ctx, ns)
		l1, err := crashed.Acquire(ctx, "sem")
		Expect(err).NotTo(HaveOccurred())
		began := time.Now()
		l2, err := waiter.Acquire(ctx, "sem", lock.WithWaitTimeout(30*time.Second))
		Expect(err).NotTo(HaveOccurred())
		Eventually(l1.Done()).Should(BeClosed(), "the crashed holder's handle ran out")
		Expect(errors.Is(context.Cause(l1.Context()), lock.ErrLockLost)).To(BeTrue())
		ended := suite.GetLock(ctx, ns, "sem").Status.FindFinished(l1.RequestID())
		Expect(ended).NotTo(BeNil())
		Expect(ended.EndReason).To(Equal(locksv1alpha1.EndReasonExpired))
		Expect(ended.Slot).NotTo(BeNil())
		Expect(l2.FencingToken()).To(BeNumerically(">", l1.FencingToken()))
		GinkgoWriter.Printf("the waiter got the crashed holder's permit %s after it acquired\n", time.Since(began).Round(time.Millisecond))
	})
})
