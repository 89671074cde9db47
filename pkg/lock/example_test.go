package lock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/kubelock/kubelock/pkg/lock"
)

// Acquire a lock, do the guarded work while the lease lasts, and release it.
func ExampleClient_Acquire() {
	c, err := lock.New(ctrl.GetConfigOrDie(), lock.WithNamespace("shop"))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	l, err := c.Acquire(ctx, "orders/42", lock.WaitTimeout(time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = l.Release(context.Background()) }()

	// l.Context() ends when the lease is lost: hand it to the guarded work.
	if err := processOrders(l.Context(), l.FencingToken()); err != nil {
		log.Print(err)
	}
}

// TryAcquire never waits: it says who holds the lock instead.
func ExampleClient_TryAcquire() {
	c, err := lock.New(ctrl.GetConfigOrDie())
	if err != nil {
		log.Fatal(err)
	}
	l, err := c.TryAcquire(context.Background(), "nightly-report")
	var locked *lock.LockedError
	switch {
	case errors.As(err, &locked):
		fmt.Println("someone else is on it:", locked.Holder.Identity)
		return
	case err != nil:
		log.Fatal(err)
	}
	defer func() { _ = l.Release(context.Background()) }()
	fmt.Println("running the report with token", l.FencingToken())
}

// The fencing token goes with every write, so the protected resource can
// refuse a paused former holder whose lease ran out.
func ExampleLock_FencingToken() {
	c, err := lock.New(ctrl.GetConfigOrDie())
	if err != nil {
		log.Fatal(err)
	}
	l, err := c.Acquire(context.Background(), "inventory")
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = l.Release(context.Background()) }()
	// UPDATE stock SET ... WHERE ... AND $token >= (SELECT token FROM fence WHERE lock_key = 'inventory')
	fmt.Printf("write with token %d\n", l.FencingToken())
}

// OnQueue reports a waiting caller's place in the lock's queue.
func ExampleOnQueue() {
	c, err := lock.New(ctrl.GetConfigOrDie())
	if err != nil {
		log.Fatal(err)
	}
	l, err := c.Acquire(context.Background(), "migrations", lock.OnQueue(func(q lock.QueueStatus) {
		log.Printf("waiting: position %d of %d", q.Position, q.Waiters)
	}))
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = l.Release(context.Background()) }()
}

func processOrders(ctx context.Context, token int64) error {
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	default:
		return nil
	}
}
