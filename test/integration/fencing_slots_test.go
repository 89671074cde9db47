package integration

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubelock/kubelock/pkg/fencing"
	"github.com/kubelock/kubelock/pkg/fencing/postgres"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/pgtest"
	"github.com/kubelock/kubelock/test/suite"
)

var _ = backends.Describe("fencing per semaphore slot (I7 per permit)", func() {
	It("lets N permit holders each guard their own row, and fences each slot on its own", func(ctx SpecContext) {
		server, err := pgtest.Start(ctx)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(server.Stop)
		dsn, err := server.CreateDatabase(ctx, "shards")
		Expect(err).NotTo(HaveOccurred())
		pool, err := pgxpool.New(ctx, dsn)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(pool.Close)
		_, err = pool.Exec(ctx, `CREATE TABLE shards (slot int PRIMARY KEY, owner text, token bigint)`)
		Expect(err).NotTo(HaveOccurred())

		ns := suite.Namespace(ctx)
		const permits = 3
		suite.NewLock(ctx, ns, "shards", semaphore(permits))
		ref := fencing.LockRef{Namespace: ns, Name: "shards"}
		v, err := fencing.NewAPIVerifierForConfig(env.Config, fencing.WithCatchUp(2*time.Second))
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(v.Close)
		guard := postgres.NewGuard(pool, postgres.WithVerifier(v))
		Expect(guard.Migrate(ctx)).To(Succeed())

		// write guards slot's row with the fence of slot alone: the key
		// namespace/name/slot, which the verifier also reads the slot from.
		write := func(slot int32, owner string, token int64) error {
			return guard.Do(ctx, ref.WithSlot(slot).String(), token, func(tx pgx.Tx) error {
				_, err := tx.Exec(context.Background(), `INSERT INTO shards VALUES ($1, $2, $3)
					ON CONFLICT (slot) DO UPDATE SET owner = excluded.owner, token = excluded.token`, slot, owner, token)
				return err
			})
		}
		row := func(slot int32) (owner string, token int64) {
			Expect(pool.QueryRow(ctx, `SELECT owner, token FROM shards WHERE slot = $1`, slot).Scan(&owner, &token)).To(Succeed())
			return owner, token
		}
		fence := func(slot int32) (token int64) {
			Expect(pool.QueryRow(ctx, `SELECT token FROM kubelock_fence WHERE lock_key = $1`, ref.WithSlot(slot).String()).Scan(&token)).To(Succeed())
			return token
		}

		By("three permit holders take slots 0, 1, 2 with rising tokens")
		holders := make([]*lock.Lock, permits)
		for i := range holders {
			c, _ := suite.NewClient(ctx, ns)
			l, err := c.Acquire(ctx, "shards")
			Expect(err).NotTo(HaveOccurred())
			Expect(slotOf(l)).To(Equal(int32(i)))
			holders[i] = l
		}

		By("each writes its own row, the highest token first: no slot fences out another")
		for i := permits - 1; i >= 0; i-- {
			l := holders[i]
			Expect(write(slotOf(l), fmt.Sprintf("holder %d", i), l.FencingToken())).To(Succeed())
		}
		By("and concurrently, many times over")
		var wg sync.WaitGroup
		for i, l := range holders {
			wg.Go(func() {
				defer GinkgoRecover()
				for range 20 {
					Expect(write(slotOf(l), fmt.Sprintf("holder %d", i), l.FencingToken())).To(Succeed())
				}
			})
		}
		wg.Wait()
		for i, l := range holders {
			owner, token := row(int32(i))
			Expect(owner).To(Equal(fmt.Sprintf("holder %d", i)))
			Expect(token).To(Equal(l.FencingToken()))
		}

		By("slot 0 changes hands; the new holder writes; the old one's late write is stale at slot 0 only")
		old := holders[0]
		Expect(old.Release(ctx)).To(Succeed())
		c, _ := suite.NewClient(ctx, ns)
		successor, err := c.Acquire(ctx, "shards")
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = successor.Release(context.Background()) })
		Expect(slotOf(successor)).To(Equal(int32(0)))
		Expect(write(0, "successor", successor.FencingToken())).To(Succeed())
		err = write(0, "holder 0 (late)", old.FencingToken())
		Expect(errors.Is(err, fencing.ErrStaleToken)).To(BeTrue(), "got %v", err)
		owner, _ := row(0)
		Expect(owner).To(Equal("successor"))
		Expect(write(1, "holder 1", holders[1].FencingToken())).To(Succeed(), "slot 1 is not fenced by slot 0's newer token")

		By("a token issued to another slot is refused at slot 0 and raises nothing")
		err = write(0, "holder 2 at slot 0", holders[2].FencingToken())
		Expect(errors.Is(err, fencing.ErrNotIssued)).To(BeTrue(), "got %v", err)
		Expect(fence(0)).To(Equal(successor.FencingToken()))
		owner, _ = row(0)
		Expect(owner).To(Equal("successor"))
		for _, l := range holders[1:] {
			Expect(l.Release(ctx)).To(Succeed())
		}
	})
})
