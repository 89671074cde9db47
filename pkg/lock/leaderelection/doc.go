// Package leaderelection lets client-go's leader election, and so every
// controller-runtime manager, elect on a kubelock DistributedLock instead of
// a coordination.k8s.io Lease. ResourceLock implements client-go's
// resourcelock.Interface, so leaderelection.RunOrDie and controller-runtime's
// ctrl.Options.LeaderElectionResourceLockInterface use it unchanged.
//
// What changes for the elected:
//
//   - The leader has a fencing token (FencingToken, or the Holding itself):
//     strictly greater than every token the lock issued before, for the
//     protected resource to check (pkg/fencing).
//   - Ownership is the server's: only the holding's user (and pod, with a
//     pod-bound token) may renew or release it; a Lease can be overwritten by
//     anyone with update on leases. The kubelock controller, not a candidate,
//     ends a holding that stopped renewing.
//   - Hand-off follows the lock's FIFO queue: a candidate waits in the queue on
//     a watch of the lock, and Get and Update block until it is this
//     candidate's turn, so a released lock has a new leader within
//     milliseconds instead of at the next retry period.
//
// How the calls map: Get returns the lock's holder as the election record
// (holder.identity, holder.leaseDurationSeconds, acquireTime, renewTime, and
// status.transitions as LeaderTransitions). A candidate that does not hold the
// lock joins the queue on its first call and then blocks in Get until it holds
// the lock or the elector's context ends: client-go pauses RetryPeriod after
// every answer that is not "you lead", and a candidate blocked in Get is never
// in that pause when its turn comes. (Options.ReportLeaderChanges trades this
// for OnNewLeader callbacks on the candidates that wait.)
// Update by the leader renews the holding when needed (below); Update with an
// empty holder (ReleaseOnCancel) releases it. Nothing ever writes another
// candidate's holding: an Update for a lock someone else holds waits in the
// queue and fails if the holder does not change.
//
// Stopping before anyone else starts (kubelock's invariant I5): the elector
// stops leading at most RetryPeriod + RenewDeadline after its last successful
// Update. The leader's Update therefore succeeds only when the holding's safe
// deadline (the send time of its last committed renewal plus the lease, minus
// lock.SafetyMargin) is further away than that, renewing first if it is
// not; and the release of ReleaseOnCancel gives up at the safe deadline. So the
// elector stops leading before the safe deadline, and the kubelock controller
// expires the holding only once it has not observed a renewal for the whole
// lease plus its grace: strictly later. New checks the timings up front
// (RetryPeriod + RenewDeadline must fit into the lease minus the margin), and
// Update refuses an elector whose lease duration differs from the lock's.
// A force-release (break-glass) is the exception: the next holder may start
// at once, and the fencing token is what stops the old leader's writes.
//
// One ResourceLock serves one term, as one client-go Run (and one
// controller-runtime manager) does: once its holding ended, released or lost,
// it never campaigns again. Build a new one to stand again.
package leaderelection
