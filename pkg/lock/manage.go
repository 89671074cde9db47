package lock

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// ReleaseLease ends the holding leaseID of key (exclusive or shared) for its
// holder, from a process other than the one that acquired it (the CLI's
// `release --lease-id`). Like Lock.Release it is idempotent and never touches
// another holding.
func (c *Client) ReleaseLease(ctx context.Context, key, leaseID string) (err error) {
	defer c.timed(opRelease)(&err)
	user, err := c.User(ctx)
	if err != nil {
		return err
	}
	_, err = c.end(ctx, key, opRelease, func(obj *locksv1alpha1.DistributedLock) (bool, error) {
		// leaseIDs are fresh per acquisition (lease-id rule), so a match is that
		// holding; the server, not this client, decides whether user may end it.
		now := metav1.NewMicroTime(c.cfg.clock.Now())
		if h := obj.Status.Holder; h != nil && h.LeaseID == leaseID {
			obj.EndHolding(locksv1alpha1.EndReasonReleased, user, now)
			return true, nil
		}
		if obj.EndShared(leaseID, locksv1alpha1.EndReasonReleased, user, now) {
			return true, nil
		}
		for _, f := range obj.Status.RecentAcquisitions {
			if f.LeaseID != leaseID {
				continue
			}
			if f.EndReason == locksv1alpha1.EndReasonReleased && f.EndedBy == user {
				return false, nil
			}
			return false, endedHolding(&f)
		}
		return false, lost("lease %s does not hold %s", leaseID, obj.Name)
	})
	return err
}

// ForceRelease breaks every current holding of key, exclusive and shared,
// whoever holds it, recording message and the caller as endedBy. The caller
// needs the force-release verb on distributedlocks; each holder's Done fires
// at its next renewal. It returns the records of the holdings it ended, none
// when the lock was free. One write ends at most MaxRecentAcquisitions
// holdings (each must be recorded), so many shared holdings take several;
// holdings acquired meanwhile are not touched.
func (c *Client) ForceRelease(ctx context.Context, key, message string) (ended []locksv1alpha1.FinishedHolding, err error) {
	defer c.timed(opForceRelease)(&err)
	user, err := c.User(ctx)
	if err != nil {
		return nil, err
	}
	if len(message) > 256 {
		return nil, fmt.Errorf("kubelock: the force-release reason is %d characters long; the limit is 256", len(message))
	}
	// The holdings to end are those of the first read: a busy lock never runs
	// out of new ones.
	var targets map[string]bool
	for {
		var n int
		written, err := c.end(ctx, key, opForceRelease, func(obj *locksv1alpha1.DistributedLock) (bool, error) {
			if targets == nil {
				targets = holdingIDs(obj)
			}
			n = forceEnd(obj, targets, user, message, metav1.NewMicroTime(c.cfg.clock.Now()))
			return n > 0, nil
		})
		if err != nil || written == nil {
			return ended, err
		}
		r := written.Status.RecentAcquisitions
		for _, h := range r[len(r)-n:] {
			delete(targets, h.LeaseID)
			ended = append(ended, h)
		}
	}
}

// holdingIDs are the lease IDs of obj's holdings.
func holdingIDs(obj *locksv1alpha1.DistributedLock) map[string]bool {
	ids := map[string]bool{}
	for _, h := range obj.Status.Holdings() {
		ids[h.LeaseID] = true
	}
	return ids
}

// forceEnd ends up to MaxRecentAcquisitions of obj's holdings among targets,
// each recorded with message; it returns how many it ended.
func forceEnd(obj *locksv1alpha1.DistributedLock, targets map[string]bool, user, message string, now metav1.MicroTime) int {
	n := 0
	if h := obj.Status.Holder; h != nil && targets[h.LeaseID] {
		obj.EndHolding(locksv1alpha1.EndReasonForceReleased, user, now)
		n++
	}
	var ids []string
	for _, h := range obj.Status.SharedHolders {
		if targets[h.LeaseID] && n+len(ids) < locksv1alpha1.MaxRecentAcquisitions {
			ids = append(ids, h.LeaseID)
		}
	}
	for _, id := range ids {
		obj.EndShared(id, locksv1alpha1.EndReasonForceReleased, user, now)
		n++
	}
	r := obj.Status.RecentAcquisitions
	for i := len(r) - n; i < len(r); i++ {
		r[i].Message = message
	}
	return n
}

// end applies edit to the lock and writes it, rereading on conflicts. edit
// reports whether there is anything to write. It returns the lock as written,
// nil when there was nothing to write.
func (c *Client) end(ctx context.Context, key, op string, edit func(*locksv1alpha1.DistributedLock) (bool, error)) (*locksv1alpha1.DistributedLock, error) {
	name, err := NameForKey(key)
	if err != nil {
		return nil, err
	}
	back := retryBackoff()
	for {
		obj, err := c.get(ctx, key, name, false)
		if errors.Is(err, ErrNotFound) {
			return nil, err
		}
		if err == nil {
			var write bool
			if write, err = edit(obj); err != nil || !write {
				return nil, err
			}
			err = c.writeStatus(ctx, obj)
			switch {
			case err == nil:
				return obj, nil
			case apierrors.IsConflict(err):
				c.metrics.conflict(op)
				continue
			case retry(ctx, &back, err):
				continue
			}
		}
		return nil, fmt.Errorf("kubelock: ending the holding of %q: %w", key, err)
	}
}
