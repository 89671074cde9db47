// Package metrics holds every Prometheus metric of the kubelock operator
// binary: the controller's (subsystem "controller") and the admission
// webhook's (subsystem "webhook"). Register adds them to controller-runtime's
// registry, which the manager serves on its metrics endpoint; the typed helpers
// below are the only way the rest of the operator touches them.
//
// Per-lock series are never created for the whole fleet: the hot-lock tracker
// exports at most HotLocks series per per-lock metric, whatever the number of
// locks. Modelled on Kueue's pkg/metrics.
package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Namespace and subsystems of every operator metric.
const (
	Namespace           = "kubelock"
	ControllerSubsystem = "controller"
	WebhookSubsystem    = "webhook"
)

// Label values of AdmissionDecision's outcome.
const (
	OutcomeAllowed = "allowed"
	OutcomeDenied  = "denied"
)

// Reconcile steps whose errors ReconcileError counts.
const (
	StepGet      = "get"
	StepUsername = "username"
	StepWrite    = "write_status"
	StepDelete   = "delete"
)

var (
	expirationsTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: ControllerSubsystem,
		Name: "expirations_total",
		Help: "Leases the controller expired.",
	})
	waitersDroppedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: ControllerSubsystem,
		Name: "waiters_dropped_total",
		Help: "Waiters the controller removed from a queue, by reason (WaitTimeout, HandoffTimeout).",
	}, []string{"reason"})
	idleLocksDeletedTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: ControllerSubsystem,
		Name: "idle_locks_deleted_total",
		Help: "Idle auto-created locks the controller deleted.",
	})
	transitionsObservedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: ControllerSubsystem,
		Name: "transitions_observed_total",
		Help: "Changes of holder the controller observed, by kind (Acquired, Released, Expired, ForceReleased).",
	}, []string{"kind"})
	waitSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: Namespace, Subsystem: ControllerSubsystem,
		Name:    "wait_seconds",
		Help:    "Time from the controller first seeing a waiter queued to seeing it acquire the lock.",
		Buckets: prometheus.ExponentialBuckets(0.01, 2, 16),
	})
	handoffSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: Namespace, Subsystem: ControllerSubsystem,
		Name:    "handoff_seconds",
		Help:    "Time from the controller seeing a lock free with a head waiter to seeing that waiter acquire it.",
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
	})
	queueLength = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: Namespace, Subsystem: ControllerSubsystem,
		Name:    "queue_length",
		Help:    "Length of a lock's wait queue each time the controller observes a change of holder.",
		Buckets: []float64{0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024},
	})
	locksObserved = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: Namespace, Subsystem: ControllerSubsystem,
		Name: "locks",
		Help: "DistributedLocks this controller currently observes (0 on a replica that is not the leader).",
	})
	locksHeld = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: Namespace, Subsystem: ControllerSubsystem,
		Name: "locks_held",
		Help: "DistributedLocks this controller last observed with a holder.",
	})
	waiters = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: Namespace, Subsystem: ControllerSubsystem,
		Name: "waiters",
		Help: "Waiters queued over all locks, as this controller last observed them.",
	})
	reconcileErrorsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: ControllerSubsystem,
		Name: "reconcile_errors_total",
		Help: "Reconciles that returned an error, by step (get, username, write_status, delete).",
	}, []string{"step"})
	// One series per namespace that ever held a malformed lock: bounded by namespaces.
	lockDecodeErrorsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: ControllerSubsystem,
		Name: "lock_decode_errors_total",
		Help: "Versions of DistributedLocks the controller could not decode (e.g. a time Go's metav1 types do not parse) and left alone, by namespace; each malformed resourceVersion counts once.",
	}, []string{"namespace"})
	writeConflictsTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: ControllerSubsystem,
		Name: "write_conflicts_total",
		Help: "Controller writes that lost a race (409 Conflict) and were retried.",
	})
	eventsSuppressedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: ControllerSubsystem,
		Name: "events_suppressed_total",
		Help: "Events not emitted because their lock exceeded its per-lock event rate, by reason.",
	}, []string{"reason"})
	isLeader = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: Namespace, Subsystem: ControllerSubsystem,
		Name: "is_leader",
		Help: "1 while this replica holds the leader lease and runs the controller, else 0.",
	})
	leaderChangesTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: ControllerSubsystem,
		Name: "leader_changes_total",
		Help: "Times this replica became the leader; summed over replicas, the number of leader changes.",
	})

	admissionDecisionsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: WebhookSubsystem,
		Name: "admission_decisions_total",
		Help: "Admission decisions on DistributedLock and fenced-object writes, by rule and outcome (allowed or denied); allowed requests count under rule \"none\".",
	}, []string{"rule", "outcome"})
	// Fenced objects are few, so one series per guarding lock stays bounded.
	staleTokenRejectionsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: WebhookSubsystem,
		Name: "stale_token_rejections_total",
		Help: "Updates of objects fenced by a lock that were denied for a stale or unissued fencing token, by lock (namespace/name).",
	}, []string{"lock"})

	// Hot is the tracker behind the per-lock hot-lock series.
	Hot = NewHotLocks(DefaultHotLocks)
	// Holdings reports the longest and the most overdue holding at each scrape.
	Holdings = &holdings{}
)

// Collectors returns every operator collector, for Register and for tests
// that check the dashboard names only exported metrics.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{
		expirationsTotal, waitersDroppedTotal, idleLocksDeletedTotal, transitionsObservedTotal,
		waitSeconds, handoffSeconds, queueLength, locksObserved, locksHeld, waiters,
		reconcileErrorsTotal, lockDecodeErrorsTotal, writeConflictsTotal, eventsSuppressedTotal, isLeader, leaderChangesTotal,
		admissionDecisionsTotal, staleTokenRejectionsTotal, Hot, Holdings,
	}
}

var registerOnce sync.Once

// Register adds the operator's metrics to controller-runtime's registry. It
// may be called more than once (tests start several managers in one process).
func Register() {
	registerOnce.Do(func() { ctrlmetrics.Registry.MustRegister(Collectors()...) })
}

// Expired counts a lease the controller expired.
func Expired() { expirationsTotal.Inc() }

// WaiterDropped counts a waiter the controller removed, by reason.
func WaiterDropped(reason string) { waitersDroppedTotal.WithLabelValues(reason).Inc() }

// IdleLockDeleted counts an idle auto-created lock the controller deleted.
func IdleLockDeleted() { idleLocksDeletedTotal.Inc() }

// TransitionObserved counts a change of holder by kind.
func TransitionObserved(kind string) { transitionsObservedTotal.WithLabelValues(kind).Inc() }

// Acquisition records an observed acquisition: the queue length at that moment
// and, when the controller saw them (non-zero), the wait and hand-off times.
func Acquisition(queued int, waitedSeconds, handoffSecs float64) {
	queueLength.Observe(float64(queued))
	if waitedSeconds > 0 {
		waitSeconds.Observe(waitedSeconds)
	}
	if handoffSecs > 0 {
		handoffSeconds.Observe(handoffSecs)
	}
}

// LockState is what the gauges need of one observed lock.
type LockState struct {
	Exists  bool
	Held    bool
	Waiters int
}

// LockChanged moves the fleet gauges from one observed state of a lock to the
// next; a lock seen for the first time has a zero before, a deleted lock a
// zero after.
func LockChanged(before, after LockState) {
	locksObserved.Add(b2f(after.Exists) - b2f(before.Exists))
	locksHeld.Add(b2f(after.Held) - b2f(before.Held))
	waiters.Add(float64(after.Waiters - before.Waiters))
}

// ResetLockGauges zeroes the fleet gauges, for a controller that stops leading
// and forgets its observations.
func ResetLockGauges() {
	locksObserved.Set(0)
	locksHeld.Set(0)
	waiters.Set(0)
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// ReconcileError counts a reconcile that returned an error at step.
func ReconcileError(step string) { reconcileErrorsTotal.WithLabelValues(step).Inc() }

// LockDecodeError counts a version of a lock in namespace that the controller
// could not decode.
func LockDecodeError(namespace string) { lockDecodeErrorsTotal.WithLabelValues(namespace).Inc() }

// WriteConflict counts a controller write that lost a race.
func WriteConflict() { writeConflictsTotal.Inc() }

// EventSuppressed counts an Event dropped by the per-lock rate limit.
func EventSuppressed(reason string) { eventsSuppressedTotal.WithLabelValues(reason).Inc() }

// Leading records that this replica became (true) or stopped being (false) the leader.
func Leading(leading bool) {
	if leading {
		isLeader.Set(1)
		leaderChangesTotal.Inc()
		return
	}
	isLeader.Set(0)
}

// AdmissionDecision counts an admission decision; rule is ignored when allowed.
func AdmissionDecision(rule string, allowed bool) {
	outcome := OutcomeDenied
	if allowed {
		outcome, rule = OutcomeAllowed, "none"
	}
	admissionDecisionsTotal.WithLabelValues(rule, outcome).Inc()
}

// StaleTokenRejected counts a fenced-object write refused for a stale token.
func StaleTokenRejected(lock string) { staleTokenRejectionsTotal.WithLabelValues(lock).Inc() }
