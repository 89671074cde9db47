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
	l, err := c.Acquire(ctx, "orders/42", lock.WithWaitTimeout(time.Minute))
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

// WithQueueCallback reports a waiting caller's place in the lock's queue.
func ExampleWithQueueCallback() {
	c, err := lock.New(ctrl.GetConfigOrDie())
	if err != nil {
		log.Fatal(err)
	}
	l, err := c.Acquire(context.Background(), "migrations", lock.WithQueueCallback(func(q lock.QueueStatus) {
		log.Printf("waiting: position %d of %d", q.Position, q.Waiters)
	}))
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = l.Release(context.Background()) }()
}

// A Semaphore's permit is a shared holding with a slot and a token of its
// own: the slot picks the resource the holder may use, and the protected
// resource fences per slot (pkg/fencing: LockRef.WithSlot).
func ExampleLock_Slot() {
	c, err := lock.New(ctrl.GetConfigOrDie(), lock.WithNamespace("shop"))
	if err != nil {
		log.Fatal(err)
	}
	permit, err := c.Acquire(context.Background(), "gpu-pool") // a Semaphore is always acquired shared
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = permit.Release(context.Background()) }()
	slot, _ := permit.Slot()
	fmt.Printf("using GPU %d with token %d\n", slot, permit.FencingToken())
}

// Readers of an RWMutex hold it together; a writer waits for them, and
// readers arriving after a waiting writer queue behind it.
func ExampleWithShared() {
	c, err := lock.New(ctrl.GetConfigOrDie())
	if err != nil {
		log.Fatal(err)
	}
	r, err := c.Acquire(context.Background(), "catalog", lock.WithShared())
	if errors.Is(err, lock.ErrMode) {
		log.Fatal("catalog is a Mutex: an administrator creates it as an RWMutex")
	}
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = r.Release(context.Background()) }()
}

// With WithReentrancy, a function that takes the lock may call another that
// takes it again: the inner Release only lowers the hold count.
func ExampleWithReentrancy() {
	c, err := lock.New(ctrl.GetConfigOrDie(), lock.WithReentrancy())
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	outer, err := c.Acquire(ctx, "ledger")
	if err != nil {
		log.Fatal(err)
	}
	inner, err := c.Acquire(ctx, "ledger") // the same *Lock: same token, Context and Done
	if err != nil {
		log.Fatal(err)
	}
	_ = inner.Release(ctx) // still held
	_ = outer.Release(ctx) // released
}

// AcquireAll takes several locks all or nothing, in a canonical order, so a
// transfer between two accounts never deadlocks with the reverse transfer.
func ExampleClient_AcquireAll() {
	c, err := lock.New(ctrl.GetConfigOrDie())
	if err != nil {
		log.Fatal(err)
	}
	ls, err := c.AcquireAll(context.Background(), []string{"account/17", "account/4"}, lock.WithWaitTimeout(30*time.Second))
	if err != nil {
		log.Fatal(err) // nothing is held: what was taken was released
	}
	defer func() { _ = ls.Release(context.Background()) }()
	// ls.Context() ends when any of the two is lost.
	if err := processOrders(ls.Context(), ls.Locks()[0].FencingToken()); err != nil {
		log.Print(err)
	}
}

func processOrders(ctx context.Context, token int64) error {
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	default:
		return nil
	}
}
