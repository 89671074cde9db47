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
	"k8s.io/utils/clock"
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
	StepGet    = "get"
	StepWrite  = "write_status"
	StepDelete = "delete"
)

func counter(subsystem, name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Subsystem: subsystem, Name: name, Help: help})
}

func counterVec(subsystem, name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: subsystem, Name: name, Help: help}, labels)
}

func gauge(name, help string) prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: ControllerSubsystem, Name: name, Help: help})
}

func histogram(name, help string, buckets []float64) prometheus.Histogram {
	return prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: Namespace, Subsystem: ControllerSubsystem, Name: name, Help: help, Buckets: buckets})
}

const ctrl, hook = ControllerSubsystem, WebhookSubsystem

var (
	expirationsTotal    = counter(ctrl, "expirations_total", "Leases the controller expired.")
	waitersDroppedTotal = counterVec(ctrl, "waiters_dropped_total",
		"Waiters the controller removed from a queue, by reason (WaitTimeout, HandoffTimeout, SessionExpired, SessionClosed).", "reason")
	idleLocksDeletedTotal    = counter(ctrl, "idle_locks_deleted_total", "Idle auto-created locks the controller deleted.")
	transitionsObservedTotal = counterVec(ctrl, "transitions_observed_total",
		"Changes of holder the controller observed, by kind (Acquired, Released, Expired, ForceReleased, SessionExpired, SessionClosed).", "kind")
	waitSeconds = histogram("wait_seconds",
		"Time from the controller first seeing a waiter queued to seeing it acquire the lock.",
		prometheus.ExponentialBuckets(0.01, 2, 16))
	handoffSeconds = histogram("handoff_seconds",
		"Time from the controller seeing a lock free with a head waiter to seeing that waiter acquire it.",
		prometheus.ExponentialBuckets(0.005, 2, 14))
	queueLength = histogram("queue_length",
		"Length of a lock's wait queue each time the controller observes a change of holder.",
		[]float64{0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024})
	locksObserved        = gauge("locks", "DistributedLocks this controller currently observes (0 on a replica that is not the leader).")
	locksHeld            = gauge("locks_held", "DistributedLocks this controller last observed with a holder.")
	waiters              = gauge("waiters", "Waiters queued over all locks, as this controller last observed them.")
	reconcileErrorsTotal = counterVec(ctrl, "reconcile_errors_total",
		"Reconciles that returned an error, by step (get, write_status, delete).", "step")
	// One series per namespace that ever held a malformed lock: bounded by namespaces.
	lockDecodeErrorsTotal = counterVec(ctrl, "lock_decode_errors_total",
		"Versions of DistributedLocks the controller could not decode (e.g. a time Go's metav1 types do not parse) and left alone, by namespace; each malformed resourceVersion counts once.", "namespace")
	writeConflictsTotal   = counter(ctrl, "write_conflicts_total", "Controller writes that lost a race (409 Conflict) and were retried.")
	eventsSuppressedTotal = counterVec(ctrl, "events_suppressed_total",
		"Events not emitted because their lock exceeded its per-lock event rate, by reason.", "reason")
	sessionsObserved     = gauge("sessions", "LockSessions this controller currently observes (0 on a replica that is not the leader).")
	sessionsExpiredTotal = counter(ctrl, "sessions_expired_total",
		"LockSessions the controller deleted after observing no renewal for their TTL plus grace (their holdings ended first).")
	isLeader           = gauge("is_leader", "1 while this replica holds the leader lease and runs the controller, else 0.")
	leaderChangesTotal = counter(ctrl, "leader_changes_total",
		"Times this replica became the leader; summed over replicas, the number of leader changes.")

	admissionDecisionsTotal = counterVec(hook, "admission_decisions_total",
		"Admission decisions on DistributedLock and fenced-object writes, by rule and outcome (allowed or denied); allowed requests count under rule \"none\".",
		"rule", "outcome")
	// Fenced objects are few, so one series per guarding lock stays bounded.
	staleTokenRejectionsTotal = counterVec(hook, "stale_token_rejections_total",
		"Updates of objects fenced by a lock that were denied for a stale or unissued fencing token, by lock (namespace/name).", "lock")

	// Hot is the tracker behind the per-lock hot-lock series.
	Hot = newHotLocks(DefaultHotLocks, clock.RealClock{})
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
		sessionsObserved, sessionsExpiredTotal,
		admissionDecisionsTotal, staleTokenRejectionsTotal, Hot, Holdings,
	}
}

var registerOnce sync.Once

// Register adds the operator's metrics to controller-runtime's registry; the
// manager calls it (once per process: tests start several managers in one).
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

// SessionsTracked moves the count of observed sessions by delta.
func SessionsTracked(delta int) { sessionsObserved.Add(float64(delta)) }

// SessionExpired counts a lapsed session the controller deleted.
func SessionExpired() { sessionsExpiredTotal.Inc() }

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
