package metrics

import "github.com/prometheus/client_golang/prometheus"

// ManagerSubsystem is the subsystem of what the operator's process reports
// about itself rather than about locks: its leader election.
const ManagerSubsystem = "manager"

// LeaderElectionCampaignFailing is this replica's campaign on the election
// lock (--leader-election-lock=kubelock): 1 from an attempt to join its queue
// or take it that failed until a later one succeeds, 0 while the replica
// leads, waits in the queue, or elects on a Lease. A standby is 0: waiting is
// not failing.
var LeaderElectionCampaignFailing = add(prometheus.NewGauge(prometheus.GaugeOpts{
	Namespace: Namespace, Subsystem: ManagerSubsystem, Name: "leader_election_campaign_failing",
	Help: "1 while this replica's attempts to campaign on the election lock (--leader-election-lock=kubelock) fail (no token, no permission, a denied write), 0 while it leads, waits in the lock's queue, or elects on a Lease.",
}))
