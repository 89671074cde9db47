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
// A held lock is renewed in the background every lease/3. When renewals fail
// until the client's safe deadline (the time the last successful renewal was
// sent, plus the lease, minus a margin), the lock's context is cancelled —
// before the controller can give the lock to anyone else (invariant I5).
//
// A process holding many locks renews one Session instead (NewSession, then
// Acquire with InSession or a client made WithSession): its holdings renew
// nothing, and their contexts end with the session's, which keeps I5 per
// session. A Client uses no session unless asked.
package lock
