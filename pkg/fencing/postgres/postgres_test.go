package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kubelock/kubelock/pkg/fencing"
	"github.com/kubelock/kubelock/pkg/fencing/postgres"
	"github.com/kubelock/kubelock/test/pgtest"
)

var server *pgtest.Server

func TestMain(m *testing.M) {
	var err error
	if server, err = pgtest.Start(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	if err := server.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	os.Exit(code)
}

var dbCounter int

// newGuard gives each test a database of its own with the fence and a data table.
func newGuard(t *testing.T, opts ...postgres.GuardOption) (*postgres.Guard, *pgxpool.Pool) {
	t.Helper()
	ctx := t.Context()
	dbCounter++
	dsn, err := server.CreateDatabase(ctx, fmt.Sprintf("fence_%d", dbCounter))
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	g := postgres.NewGuard(pool, opts...)
	if err := g.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE stock (item text PRIMARY KEY, qty int, written_by bigint);
		CREATE TABLE writes (seq bigserial PRIMARY KEY, token bigint)`); err != nil {
		t.Fatal(err)
	}
	return g, pool
}

func write(qty int, token int64) func(pgx.Tx) error {
	return func(tx pgx.Tx) error {
		_, err := tx.Exec(context.Background(), `INSERT INTO stock VALUES ('apples', $1, $2)
			ON CONFLICT (item) DO UPDATE SET qty = excluded.qty, written_by = excluded.written_by`, qty, token)
		if err != nil {
			return err
		}
		_, err = tx.Exec(context.Background(), `INSERT INTO writes (token) VALUES ($1)`, token)
		return err
	}
}

func TestGuardRejectsStaleTokensAndRollsBack(t *testing.T) {
	ctx := t.Context()
	g, pool := newGuard(t)
	if err := g.Do(ctx, "stock", 10, write(1, 10)); err != nil {
		t.Fatal(err)
	}
	if err := g.Do(ctx, "stock", 10, write(2, 10)); err != nil {
		t.Fatalf("an equal token must be accepted: %v", err)
	}
	err := g.Do(ctx, "stock", 9, write(3, 9))
	var stale *fencing.StaleTokenError
	if !errors.As(err, &stale) || stale.Highest != 10 || stale.Token != 9 {
		t.Fatalf("a lower token: err = %v", err)
	}
	var qty int
	var by int64
	if err := pool.QueryRow(ctx, `SELECT qty, written_by FROM stock`).Scan(&qty, &by); err != nil {
		t.Fatal(err)
	}
	if qty != 2 || by != 10 {
		t.Fatalf("stored qty %d by token %d, want 2 by 10", qty, by)
	}
	// An error in the operation rolls the fence back too.
	boom := errors.New("boom")
	if err := g.Do(ctx, "stock", 20, func(pgx.Tx) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("err = %v", err)
	}
	if err := g.Do(ctx, "stock", 15, write(4, 15)); err != nil {
		t.Fatalf("the rolled-back token 20 must not fence out 15: %v", err)
	}
}

// A holder stopped inside Do (here: its fn waits, sending nothing, as a
// SIGSTOPped process would) keeps the fence row locked. Its successor's write
// must not wait for it past the guard's idle bound: PostgreSQL ends the stopped
// transaction and the successor's token is accepted. The successor's deadline
// is the bound plus 10 s of slack; the stopped holder's write is rolled back.
func TestGuardSuccessorNotBlockedByStoppedHolder(t *testing.T) {
	ctx := t.Context()
	const idle = time.Second
	g, pool := newGuard(t, postgres.WithIdleTimeout(idle))
	inside, resume := make(chan struct{}), make(chan struct{})
	var once sync.Once
	wake := func() { once.Do(func() { close(resume) }) }
	defer wake() // on a failure too, so the pool can close
	stopped := make(chan error, 1)
	go func() {
		stopped <- g.Do(ctx, "stock", 10, func(tx pgx.Tx) error {
			if err := write(1, 10)(tx); err != nil {
				return err
			}
			close(inside)
			<-resume // stopped between its statements
			_, err := tx.Exec(ctx, `INSERT INTO writes (token) VALUES (10)`)
			return err
		})
	}()
	<-inside
	sctx, cancel := context.WithTimeout(ctx, idle+10*time.Second)
	defer cancel()
	start := time.Now()
	if err := g.Do(sctx, "stock", 11, write(2, 11)); err != nil {
		t.Fatalf("the successor's token 11 was not accepted within %s: %v", idle+10*time.Second, err)
	}
	t.Logf("the successor waited %s for the stopped holder (bound %s)", time.Since(start).Round(time.Millisecond), idle)
	wake()
	if err := <-stopped; err == nil {
		t.Fatal("the stopped holder's transaction committed after its session was ended")
	}
	var qty int
	var by int64
	if err := pool.QueryRow(ctx, `SELECT qty, written_by FROM stock`).Scan(&qty, &by); err != nil {
		t.Fatal(err)
	}
	if qty != 2 || by != 11 {
		t.Fatalf("stored qty %d from token %d, want 2 from 11", qty, by)
	}
}

// Sixteen writers with interleaved tokens: the stored value always comes from
// the highest token seen, and once a token was accepted no lower one writes.
func TestGuardUnderConcurrentWriters(t *testing.T) {
	for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable} {
		t.Run(string(iso), func(t *testing.T) {
			ctx := t.Context()
			g, pool := newGuard(t, postgres.WithTxOptions(pgx.TxOptions{IsoLevel: iso}))
			const writers, perWriter = 16, 25
			seed := rand.Uint64()
			t.Logf("seed %d", seed)
			var wg sync.WaitGroup
			var mu sync.Mutex
			accepted, rejected := 0, 0
			for w := range writers {
				rng := rand.New(rand.NewPCG(seed, uint64(w)))
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range perWriter {
						// Tokens rise over time but overlap between writers, as
						// when a paused former holder writes late.
						token := int64(1 + i*writers + rng.IntN(3*writers))
						err := g.Do(ctx, "stock", token, write(int(token), token))
						mu.Lock()
						switch {
						case err == nil:
							accepted++
						case errors.Is(err, fencing.ErrStaleToken):
							rejected++
						default:
							t.Errorf("token %d: %v", token, err)
						}
						mu.Unlock()
					}
				}()
			}
			wg.Wait()

			rows, err := pool.Query(ctx, `SELECT token FROM writes ORDER BY seq`)
			if err != nil {
				t.Fatal(err)
			}
			tokens, err := pgx.CollectRows(rows, pgx.RowTo[int64])
			if err != nil {
				t.Fatal(err)
			}
			if len(tokens) != accepted {
				t.Fatalf("%d writes recorded, %d accepted", len(tokens), accepted)
			}
			for i := 1; i < len(tokens); i++ {
				if tokens[i] < tokens[i-1] {
					t.Fatalf("write %d carries token %d after token %d was accepted", i, tokens[i], tokens[i-1])
				}
			}
			var by, fence int64
			if err := pool.QueryRow(ctx, `SELECT written_by, (SELECT token FROM kubelock_fence WHERE lock_key = 'stock') FROM stock`).Scan(&by, &fence); err != nil {
				t.Fatal(err)
			}
			if by != tokens[len(tokens)-1] || fence != by {
				t.Fatalf("stored value from token %d, fence %d, highest accepted %d", by, fence, tokens[len(tokens)-1])
			}
			t.Logf("%s: %d accepted, %d rejected as stale", iso, accepted, rejected)
		})
	}
}

// TestGuardWithVerifierRefusesUnissuedTokens: a token above the lock's current
// one is refused before the fence is touched, so the holder is still accepted.
func TestGuardWithVerifierRefusesUnissuedTokens(t *testing.T) {
	ctx := t.Context()
	const current = 40
	v := fencing.VerifierFunc(func(_ context.Context, lock fencing.LockRef, token int64) error {
		if token > current {
			return fmt.Errorf("%w: token %d by lock %s", fencing.ErrNotIssued, token, lock)
		}
		return nil
	})
	g, pool := newGuard(t, postgres.WithVerifier(v))
	if err := g.Do(ctx, "shop/stock", 1<<63-1, write(9, 1<<63-1)); !errors.Is(err, fencing.ErrNotIssued) {
		t.Fatalf("a forged token: err = %v", err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM kubelock_fence`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("the forged token left %d fence rows (%v)", n, err)
	}
	if err := g.Do(ctx, "shop/stock", current, write(1, current)); err != nil {
		t.Fatalf("the holder after a forged token: %v", err)
	}
	if err := g.Do(ctx, "stock", current, write(1, current)); err == nil || !strings.Contains(err.Error(), "namespace/name") {
		t.Fatalf("a lock without namespace: err = %v", err)
	}
}
