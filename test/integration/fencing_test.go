package integration

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/internal/pgtest"
	"github.com/kubelock/kubelock/pkg/fencing"
	"github.com/kubelock/kubelock/pkg/lock"
)

var _ = Describe("fencing at the protected resource (I7)", Ordered, func() {
	var (
		pool  *pgxpool.Pool
		guard *fencing.Guard
	)
	BeforeAll(func(ctx SpecContext) {
		server, err := pgtest.Start(ctx)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(server.Stop)
		dsn, err := server.CreateDatabase(ctx, "shop")
		Expect(err).NotTo(HaveOccurred())
		pool, err = pgxpool.New(ctx, dsn)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(pool.Close)
		guard = fencing.NewGuard(pool)
		Expect(guard.Migrate(ctx)).To(Succeed())
		_, err = pool.Exec(ctx, `CREATE TABLE orders (id int PRIMARY KEY, status text, token bigint)`)
		Expect(err).NotTo(HaveOccurred())
	})

	writeOrder := func(status string, token int64) func(pgx.Tx) error {
		return func(tx pgx.Tx) error {
			_, err := tx.Exec(context.Background(), `INSERT INTO orders VALUES (1, $1, $2)
				ON CONFLICT (id) DO UPDATE SET status = excluded.status, token = excluded.token`, status, token)
			return err
		}
	}

	It("rejects the late write of a holder paused past its lease; the successor's data stays", func() {
		ctx := context.Background()
		ns := newNamespace(ctx)
		newLock(ctx, ns, "orders-db", locksv1alpha1.DistributedLockSpec{LeaseDurationSeconds: 2})
		// A paused process renews nothing: A's client never renews on its own.
		a, _ := newClient(ctx, ns, lock.WithoutAutoRenew())
		b, _ := newClient(ctx, ns)

		held, err := a.Acquire(ctx, "orders-db")
		Expect(err).NotTo(HaveOccurred())
		Expect(guard.Do(ctx, "orders-db", held.FencingToken(), writeOrder("created by A", held.FencingToken()))).To(Succeed())

		By("A pauses with its next write prepared; its lease runs out")
		resume := make(chan struct{})
		lateWrite := make(chan error, 1)
		go func() {
			<-resume
			lateWrite <- guard.Do(ctx, "orders-db", held.FencingToken(), writeOrder("paid by A (late)", held.FencingToken()))
		}()
		Eventually(held.Done(), 5*time.Second).Should(BeClosed())
		doneAt := time.Now()

		By("the controller expires A and B takes over and writes")
		next, err := b.Acquire(ctx, "orders-db", lock.WaitTimeout(time.Minute))
		Expect(err).NotTo(HaveOccurred())
		Expect(doneAt.Before(time.Now())).To(BeTrue())
		Expect(next.FencingToken()).To(BeNumerically(">", held.FencingToken()))
		Expect(guard.Do(ctx, "orders-db", next.FencingToken(), writeOrder("shipped by B", next.FencingToken()))).To(Succeed())

		By("A resumes: its write is refused")
		close(resume)
		var err2 error
		Eventually(lateWrite).Should(Receive(&err2))
		Expect(errors.Is(err2, fencing.ErrStaleToken)).To(BeTrue(), "got %v", err2)
		var stale *fencing.StaleTokenError
		Expect(errors.As(err2, &stale)).To(BeTrue())
		Expect(stale.Highest).To(Equal(next.FencingToken()))

		var status string
		var token int64
		Expect(pool.QueryRow(ctx, `SELECT status, token FROM orders WHERE id = 1`).Scan(&status, &token)).To(Succeed())
		Expect(status).To(Equal("shipped by B"))
		Expect(token).To(Equal(next.FencingToken()))
		Expect(context.Cause(held.Context())).To(MatchError(lock.ErrLockLost))
		Expect(next.Release(ctx)).To(Succeed())
	})
})
