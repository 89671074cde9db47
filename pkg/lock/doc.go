// Package lock is the Go client of kubelock: distributed locks stored as
// DistributedLock objects in the Kubernetes apiserver, acquired, renewed and
// released with resourceVersion compare-and-swap writes, so every operation is
// committed by etcd's quorum.
//
// The shape follows etcd's concurrency package:
//
//	c, err := lock.New(cfg, lock.WithNamespace("shop"))
//	l, err := c.Acquire(ctx, "orders/42")       // waits in the lock's FIFO queue
//	defer l.Release(context.Background())
//	select {
//	case <-l.Done(): // the lease is lost or can no longer be proven: stop working
//	default:
//	}
//	write(l.FencingToken())                      // the protected resource checks the token
//
// Every option is named With…, and its doc says its default. An Option
// configures a Client (New), an AcquireOption one call of Acquire, TryAcquire
// or AcquireAll, and a DefaultOption (WithLeaseDuration, WithWaitTimeout,
// WithSession) either: given to New it is the default of every call, given
// to one call it overrides that default for the call:
//
//	c, err := lock.New(cfg, lock.WithLeaseDuration(30*time.Second))          // every call's lease
//	l, err := c.Acquire(ctx, "report", lock.WithLeaseDuration(2*time.Minute)) // this call's
//
// On a cluster that serves locks from kubelock-apiserver, NewDirect sends
// lock requests straight to its Service instead of through kube-apiserver's
// proxy, which costs the control plane about two thirds of a Lease write per
// request; FindServer finds that Service and its CA in the lock API's
// APIService:
//
//	server, err := lock.FindServer(ctx, cfg)
//	c, err := lock.NewDirect(cfg, server)
//
// A held lock is renewed in the background every lease/3. When renewals fail
// until the client's safe deadline (the time the last successful renewal was
// sent, plus the lease, minus SafetyMargin), the lock's context is cancelled
// — before the controller can give the lock to anyone else (invariant I5).
//
// A process holding many locks renews one Session instead (NewSession, then
// WithSession on the client or on one call): its holdings renew nothing, and
// their contexts end with the session's, which keeps I5 per session. A Client
// uses no session unless asked.
//
// Locks come in three types (spec.type, set by the administrator): a Mutex
// has one holder; an RWMutex one writer or many readers; a Semaphore up to
// spec.permits holders. Readers and permits are shared holdings, each with
// its own slot and fencing token; the queue is FIFO across modes, so a writer
// is never starved by a stream of readers:
//
//	r, err := c.Acquire(ctx, "catalog", lock.WithShared()) // an RWMutex's reader
//	p, err := c.Acquire(ctx, "gpu-pool")                   // a Semaphore: always shared
//	slot, _ := p.Slot()                                    // the permit, in [0, permits)
//
// Acquiring WithShared on a Mutex returns ErrMode. A Client made
// WithReentrancy counts re-entries: Acquire of a key it holds returns the
// same *Lock, and only the last Release frees it. AcquireAll takes several
// keys all or nothing, in a canonical order so that two callers never
// deadlock, with one Done for the set:
//
//	ls, err := c.AcquireAll(ctx, []string{"orders", "invoices"}, lock.WithWaitTimeout(time.Minute))
//	defer ls.Release(context.Background())
package lock
