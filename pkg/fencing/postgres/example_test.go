package postgres_test

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kubelock/kubelock/pkg/fencing"
	"github.com/kubelock/kubelock/pkg/fencing/postgres"
)

// A holder writes to PostgreSQL with its token; the Guard refuses a stale
// token and, with a verifier, one the lock never issued.
func ExampleGuard_Do() {
	ctx := context.Background()
	var pool *pgxpool.Pool
	var verifier fencing.Verifier
	var token int64 // the holding's FencingToken()
	guard := postgres.NewGuard(pool, postgres.WithVerifier(verifier))
	err := guard.Do(ctx, "shop/orders-db", token, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE orders SET status = 'shipped' WHERE id = $1`, 42)
		return err
	})
	switch {
	case errors.Is(err, fencing.ErrStaleToken):
		// a later holder wrote first: this holding is over
	case errors.Is(err, fencing.ErrNotIssued):
		// not a token of shop/orders-db: nothing was raised
	}
}
