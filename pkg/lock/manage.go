package lock

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// ReleaseLease ends the holding leaseID of key for its holder, from a process
// other than the one that acquired it (the CLI's `release --lease-id`). Like
// Lock.Release it is idempotent and never touches another holding.
func (c *Client) ReleaseLease(ctx context.Context, key, leaseID string) (err error) {
	defer c.timed(opRelease)(&err)
	user, err := c.User(ctx)
	if err != nil {
		return err
	}
	_, err = c.end(ctx, key, opRelease, func(obj *locksv1alpha1.DistributedLock) (bool, error) {
		// leaseIDs are fresh per acquisition (lease-id rule), so a match is that
		// holding; the server, not this client, decides whether user may end it.
		if h := obj.Status.Holder; h != nil && h.LeaseID == leaseID {
			obj.EndHolding(locksv1alpha1.EndReasonReleased, user, metav1.NewMicroTime(c.cfg.clock.Now()))
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

// ForceRelease breaks the current holding of key whoever holds it, recording
// message and the caller as endedBy. The caller needs the force-release verb
// on distributedlocks; the holder's Done fires at its next renewal. It returns
// the record of the holding it ended, or nil when the lock was free.
func (c *Client) ForceRelease(ctx context.Context, key, message string) (f *locksv1alpha1.FinishedHolding, err error) {
	defer c.timed(opForceRelease)(&err)
	user, err := c.User(ctx)
	if err != nil {
		return nil, err
	}
	if len(message) > 256 {
		return nil, fmt.Errorf("kubelock: the force-release reason is %d characters long; the limit is 256", len(message))
	}
	return c.end(ctx, key, opForceRelease, func(obj *locksv1alpha1.DistributedLock) (bool, error) {
		if obj.Status.Holder == nil {
			return false, nil
		}
		obj.EndHolding(locksv1alpha1.EndReasonForceReleased, user, metav1.NewMicroTime(c.cfg.clock.Now()))
		obj.Status.RecentAcquisitions[len(obj.Status.RecentAcquisitions)-1].Message = message
		return true, nil
	})
}

// end applies edit to the lock and writes it, rereading on conflicts. edit
// reports whether there is anything to write. It returns the record of the
// holding that ended, if any.
func (c *Client) end(ctx context.Context, key, op string, edit func(*locksv1alpha1.DistributedLock) (bool, error)) (*locksv1alpha1.FinishedHolding, error) {
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
			obj.Status.ObservedGeneration = obj.Generation
			err = c.c.Status().Update(ctx, obj)
			switch {
			case err == nil:
				r := obj.Status.RecentAcquisitions
				return &r[len(r)-1], nil
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
