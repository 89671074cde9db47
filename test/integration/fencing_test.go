package integration

import (
	"context"
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/fencing"
	"github.com/kubelock/kubelock/pkg/fencing/postgres"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/pgtest"
	"github.com/kubelock/kubelock/test/suite"
)

var _ = backends.Describe("fencing at the protected resource (I7)", Ordered, func() {
	var (
		pool  *pgxpool.Pool
		guard *postgres.Guard
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
		guard = postgres.NewGuard(pool)
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
		ns := suite.Namespace(ctx)
		suite.NewLock(ctx, ns, "orders-db", locksv1alpha1.DistributedLockSpec{LeaseDurationSeconds: 2})
		// A paused process renews nothing: A's client never renews on its own.
		a, _ := suite.NewClient(ctx, ns, lock.WithoutAutoRenew())
		b, _ := suite.NewClient(ctx, ns)

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
		next, err := b.Acquire(ctx, "orders-db", lock.WithWaitTimeout(time.Minute))
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

	// Chubby's CheckSequencer: the resource accepts only tokens the lock
	// issued, read from the apiserver through the verifier's cached watch.
	It("refuses a forged token at the Guard and the Middleware, raising nothing; the holder still writes", func(ctx SpecContext) {
		ns := suite.Namespace(ctx)
		suite.NewLock(ctx, ns, "orders-db", locksv1alpha1.DistributedLockSpec{})
		ref := fencing.LockRef{Namespace: ns, Name: "orders-db"}
		v, err := fencing.NewAPIVerifierForConfig(env.Config, fencing.WithCatchUp(2*time.Second))
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(v.Close)
		vguard := postgres.NewGuard(pool, postgres.WithVerifier(v))
		store := fencing.NewMemoryStore()
		var served []int64
		srv := httptest.NewServer(fencing.Middleware(fencing.Fence{
			Locks:    map[string]fencing.LockRef{"orders-db": ref},
			Verifier: v,
			Store:    store,
		}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			t, _ := strconv.ParseInt(r.Header.Get(fencing.HeaderToken), 10, 64)
			served = append(served, t)
			w.WriteHeader(http.StatusNoContent)
		})))
		DeferCleanup(srv.Close)
		post := func(key string, token int64) (int, string) {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, nil)
			Expect(err).NotTo(HaveOccurred())
			req.Header.Set(fencing.HeaderLock, key)
			req.Header.Set(fencing.HeaderToken, strconv.FormatInt(token, 10))
			resp, err := http.DefaultClient.Do(req)
			Expect(err).NotTo(HaveOccurred())
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(body)
		}
		fence := func() int64 {
			var t int64
			Expect(pool.QueryRow(ctx, `SELECT token FROM kubelock_fence WHERE lock_key = $1`, ref.String()).Scan(&t)).To(Succeed())
			return t
		}
		c, _ := suite.NewClient(ctx, ns)

		By("a first holding writes; its token starts the verifier's watch")
		first, err := c.Acquire(ctx, "orders-db")
		Expect(err).NotTo(HaveOccurred())
		Expect(vguard.Do(ctx, ref.String(), first.FencingToken(), writeOrder("by the first holder", first.FencingToken()))).To(Succeed())
		Expect(first.Release(ctx)).To(Succeed())

		By("a token of a lock that was just acquired is accepted (the cache catches up)")
		second, err := c.Acquire(ctx, "orders-db")
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = second.Release(context.Background()) })
		t2 := second.FencingToken()
		Expect(vguard.Do(ctx, ref.String(), t2, writeOrder("by the second holder", t2))).To(Succeed())
		code, body := post("orders-db", t2)
		Expect(code).To(Equal(http.StatusNoContent), body)

		By("a forged token 2^63-1 is refused by both, and raises nothing")
		const forged = math.MaxInt64
		err = vguard.Do(ctx, ref.String(), forged, writeOrder("forged", forged))
		Expect(errors.Is(err, fencing.ErrNotIssued)).To(BeTrue(), "got %v", err)
		Expect(err.Error()).NotTo(MatchRegexp(`\b%d\b`, t2), "the refusal must not reveal the lock's token")
		Expect(fence()).To(Equal(t2))
		code, body = post("orders-db", forged)
		Expect(code).To(Equal(http.StatusForbidden))
		Expect(body).To(ContainSubstring(`"reason":"not-issued"`))
		Expect(body).To(ContainSubstring("was never issued"))

		By("the rightful holder is still accepted by both")
		Expect(vguard.Do(ctx, ref.String(), t2, writeOrder("by the second holder, again", t2))).To(Succeed())
		code, body = post("orders-db", t2)
		Expect(code).To(Equal(http.StatusNoContent), body)
		var status string
		Expect(pool.QueryRow(ctx, `SELECT status FROM orders WHERE id = 1`).Scan(&status)).To(Succeed())
		Expect(status).To(Equal("by the second holder, again"))

		By("the first holder's token is stale at both")
		err = vguard.Do(ctx, ref.String(), first.FencingToken(), writeOrder("late", first.FencingToken()))
		Expect(errors.Is(err, fencing.ErrStaleToken)).To(BeTrue(), "got %v", err)
		code, body = post("orders-db", first.FencingToken())
		Expect(code).To(Equal(http.StatusConflict), body)

		By("a lock key the resource was not configured with is refused, whatever the token")
		code, body = post(ns+"/another-lock", 1)
		Expect(code).To(Equal(http.StatusForbidden))
		Expect(body).To(ContainSubstring("does not guard this resource"))
		Expect(served).To(Equal([]int64{t2, t2}))
	})

	It("says why while its watch of the lock cannot list it", func(ctx SpecContext) {
		u, err := env.AddUser(envtest.User{Name: "no-lock-rights"}, nil)
		Expect(err).NotTo(HaveOccurred())
		v, err := fencing.NewAPIVerifierForConfig(u.Config(), fencing.WithSyncTimeout(time.Second))
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(v.Close)
		err = v.Verify(ctx, fencing.LockRef{Namespace: "default", Name: "orders-db"}, 1)
		Expect(errors.Is(err, fencing.ErrNotSynced)).To(BeTrue(), "got %v", err)
		Expect(errors.Is(err, fencing.ErrNotIssued)).To(BeFalse())
		Expect(err.Error()).To(ContainSubstring("forbidden"))
	})
})
