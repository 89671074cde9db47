package fencing_test

import (
	"context"
	"errors"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"k8s.io/client-go/rest"

	"github.com/kubelock/kubelock/pkg/fencing"
)

// A service guarded by the lock shop/orders-db accepts only tokens that lock
// issued, and never a lower one than it accepted before.
func ExampleMiddleware() {
	var cfg *rest.Config // the service's own connection: get, list, watch on distributedlocks
	verifier, err := fencing.NewAPIVerifierForConfig(cfg)
	if err != nil {
		panic(err)
	}
	defer verifier.Close()
	orders := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	http.Handle("/orders", fencing.Middleware(fencing.Fence{
		// The service names its lock; the client's Kubelock-Lock header
		// ("orders-db", as fencing.Transport sends Holding.Key) only picks it.
		Locks:    map[string]fencing.LockRef{"orders-db": {Namespace: "shop", Name: "orders-db"}},
		Verifier: verifier,
		Store:    fencing.NewMemoryStore(),
	}, orders))
}

// A holder writes to PostgreSQL with its token; the Guard refuses a stale
// token and, with a verifier, one the lock never issued.
func ExampleGuard_Do() {
	ctx := context.Background()
	var pool *pgxpool.Pool
	var verifier fencing.Verifier
	var token int64 // the holding's FencingToken()
	guard := fencing.NewGuard(pool, fencing.WithVerifier(verifier))
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
