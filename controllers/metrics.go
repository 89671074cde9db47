package controllers

import (
	"context"
	"time"

	"github.com/kubelock/kubelock/internal/metrics"
)

// The controller's metrics live in internal/metrics; this file connects the
// reconciler's observations and its leadership to them.

// leaderReporter is a manager runnable that needs leader election: the manager
// starts it when this replica becomes leader (at once without leader
// election) and stops it when leadership ends.
type leaderReporter struct {
	obs      *observations
	sessions *sessionObservations
	clock    interface{ Now() time.Time }
	grace    time.Duration
}

// NeedLeaderElection implements manager.LeaderElectionRunnable.
func (*leaderReporter) NeedLeaderElection() bool { return true }

// Start implements manager.Runnable.
func (l *leaderReporter) Start(ctx context.Context) error {
	metrics.Leading(true)
	metrics.SetHoldingSource(func() metrics.HoldingStats { return l.obs.stats(l.clock.Now(), l.grace) })
	<-ctx.Done()
	metrics.Leading(false)
	metrics.SetHoldingSource(nil)
	// A replica that no longer leads stops reconciling; what it observed no
	// longer describes the fleet.
	l.obs.clear()
	l.sessions.clear()
	return nil
}

// stateOf is what the fleet gauges count of an observation (nil: none).
func stateOf(o *observation) metrics.LockState {
	if o == nil {
		return metrics.LockState{}
	}
	return metrics.LockState{Exists: true, Held: o.holding != nil, Waiters: len(o.waiters)}
}
