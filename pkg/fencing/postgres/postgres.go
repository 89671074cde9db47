// Package postgres fences operations on PostgreSQL (invariant I7): Guard runs
// them in a transaction that first raises the lock's fence row to the
// holder's token. It is a package of its own so that users of pkg/fencing's
// HTTP middleware and of pkg/lock do not link pgx.
package postgres

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubelock/kubelock/pkg/fencing"
)

// Migration creates the fence table; Guard.Migrate runs it.
//
//go:embed migrations/001_fence.sql
var Migration string

// raiseSQL is the atomic compare-and-raise: it inserts or raises the lock's
// token and returns a row only when the token is not lower than the stored one.
// The row stays locked until the transaction ends, so the caller's statements
// for one lock run one transaction at a time, in token order.
const raiseSQL = `INSERT INTO kubelock_fence AS fence (lock_key, token) VALUES ($1, $2)
ON CONFLICT (lock_key) DO UPDATE SET token = excluded.token, updated_at = now()
WHERE fence.token <= excluded.token
RETURNING fence.token`

// DB is what Guard needs of a database handle: *pgxpool.Pool and *pgx.Conn both fit.
type DB interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Guard runs operations on PostgreSQL only for current tokens.
//
// Isolation: at READ COMMITTED (PostgreSQL's default) concurrent writers of one
// lock queue on the fence row and each sees the token the previous one
// committed. At REPEATABLE READ and SERIALIZABLE the later of two concurrent
// writers gets a serialization failure instead; Guard retries those (up to 30
// times, after a random growing pause) in a fresh transaction, so callers see
// success or fencing.ErrStaleToken.
//
// A holder that stops inside Do (a process paused, a network cut) would keep
// the fence row locked, and with it every later holder of the lock, for as
// long as its connection lives. Do therefore bounds how long its transaction
// may sit idle: PostgreSQL ends a session idle in a transaction for longer than
// WithIdleTimeout (default DefaultIdleTimeout), which rolls it back and frees
// the row. A successor's write waits at most that long for a stopped
// predecessor.
//
// With WithVerifier, Do also refuses a token the lock never issued (above
// its current token) before it touches the fence: a forged token raises
// nothing. Without one, Guard trusts the token it is given, which suits only
// tests and callers that took the token from their own holding.
type Guard struct {
	verifier fencing.Verifier
	db       DB
	txOpts   pgx.TxOptions
	retries  int
	metrics  *fencing.Metrics
	idle     time.Duration
}

// DefaultIdleTimeout is how long a transaction of Do may sit idle (waiting for
// its caller's next statement) before PostgreSQL ends it.
const DefaultIdleTimeout = 5 * time.Second

// GuardOption configures a Guard.
type GuardOption func(*Guard)

// WithTxOptions sets the transaction options (isolation level) of Do.
func WithTxOptions(o pgx.TxOptions) GuardOption { return func(g *Guard) { g.txOpts = o } }

// WithVerifier makes Do check with v that the guarding lock issued each
// token; Do's lock argument is then the lock's "namespace/name"
// (fencing.ParseLockRef), which is also the fence row's key.
func WithVerifier(v fencing.Verifier) GuardOption { return func(g *Guard) { g.verifier = v } }

// WithIdleTimeout sets how long Do's transaction may wait idle for the
// caller's next statement before PostgreSQL ends the session and rolls the
// transaction back (its idle_in_transaction_session_timeout, set for the
// transaction only). It is also the longest a successor's write waits for a
// holder stopped inside Do. Whole milliseconds, at least one. Default
// DefaultIdleTimeout.
func WithIdleTimeout(d time.Duration) GuardOption { return func(g *Guard) { g.idle = d } }

// WithMetrics counts the Guard's stale-token rejections in m.
func WithMetrics(m *fencing.Metrics) GuardOption { return func(g *Guard) { g.metrics = m } }

// NewGuard returns a Guard on db.
func NewGuard(db DB, opts ...GuardOption) *Guard {
	g := &Guard{db: db, retries: 30, idle: DefaultIdleTimeout}
	for _, o := range opts {
		o(g)
	}
	g.idle = max(g.idle.Truncate(time.Millisecond), time.Millisecond)
	return g
}

// Migrate creates the fence table if it does not exist.
func (g *Guard) Migrate(ctx context.Context) error {
	_, err := g.db.Exec(ctx, Migration)
	return err
}

// Do runs fn in one transaction that first raises the lock's fence to token.
// A lower token rolls back before fn runs and returns a *fencing.StaleTokenError; an
// error from fn rolls everything back, the fence included. With a verifier, a
// token the lock never issued returns an error wrapping fencing.ErrNotIssued before any
// transaction begins (issuance never goes back, so checking it first is safe).
func (g *Guard) Do(ctx context.Context, lock string, token int64, fn func(pgx.Tx) error) error {
	if err := g.verify(ctx, lock, token); err != nil {
		return err
	}
	// A serialization failure or deadlock did nothing: retry after a random,
	// growing pause (up to 64ms) so contending writers spread out.
	back := wait.Backoff{Duration: 500 * time.Microsecond, Factor: 2, Jitter: 1, Steps: 6}
	for attempt := 0; ; attempt++ {
		err := g.do(ctx, lock, token, fn)
		var pgErr *pgconn.PgError
		if attempt >= g.retries || !errors.As(err, &pgErr) || (pgErr.Code != "40001" && pgErr.Code != "40P01") {
			return g.metrics.Count(err)
		}
		select {
		case <-ctx.Done():
			return g.metrics.Count(err)
		case <-time.After(back.Step()):
		}
	}
}

func (g *Guard) verify(ctx context.Context, lock string, token int64) error {
	if g.verifier == nil {
		return nil
	}
	ref, err := fencing.ParseLockRef(lock)
	if err != nil {
		return err
	}
	return g.metrics.Count(g.verifier.Verify(ctx, ref, token))
}

func (g *Guard) do(ctx context.Context, lock string, token int64, fn func(pgx.Tx) error) (err error) {
	tx, err := g.db.BeginTx(ctx, g.txOpts)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(ctx)
		}
	}()
	// The bound and the raise in one round trip: the bound is in place before
	// the fence row is locked.
	b := &pgx.Batch{}
	b.Queue(`SELECT set_config('idle_in_transaction_session_timeout', $1, true)`, fmt.Sprint(g.idle.Milliseconds()))
	b.Queue(raiseSQL, lock, token)
	var accepted int64
	br := tx.SendBatch(ctx, b)
	if _, err = br.Exec(); err != nil {
		_ = br.Close()
		return fmt.Errorf("kubelock: bounding the transaction of %q: %w", lock, err)
	}
	err = br.QueryRow().Scan(&accepted)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		var highest int64
		if err := tx.QueryRow(ctx, `SELECT token FROM kubelock_fence WHERE lock_key = $1`, lock).Scan(&highest); err != nil {
			return fmt.Errorf("kubelock: reading the fence of %q: %w", lock, err)
		}
		return &fencing.StaleTokenError{Lock: lock, Token: token, Highest: highest}
	case err != nil:
		return fmt.Errorf("kubelock: raising the fence of %q: %w", lock, err)
	}
	if fn != nil {
		if err = fn(tx); err != nil {
			return err
		}
	}
	return tx.Commit(ctx)
}

// Accept implements fencing.Store: it raises the fence in a transaction of its own.
// To make the check and the operation atomic, run the operation in Do instead.
func (g *Guard) Accept(ctx context.Context, lock string, token int64) error {
	return g.Do(ctx, lock, token, nil)
}
