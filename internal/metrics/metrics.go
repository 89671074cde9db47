// Package metrics holds every Prometheus metric of the kubelock operator
// binary: the controller's (subsystem "controller"), the admission
// webhook's (subsystem "webhook") and the process's own leader election
// (subsystem "manager"). Register adds them to controller-runtime's
// registry, which the manager serves on its metrics endpoint.
//
// Every label takes a fixed set of values (rules, reasons, steps, modes) or a
// namespace's name (created by administrators), except the lock's: per-lock
// series come only from the hot-lock tracker, which exports at most
// DefaultHotLocks series per per-lock metric, whatever the number of locks,
// and only of locks the caller observed or read (never a name a request
// merely carried). Modelled on Kueue's pkg/metrics.
package metrics

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// Namespace and subsystems of every operator metric.
const (
	Namespace           = "kubelock"
	ControllerSubsystem = "controller"
	WebhookSubsystem    = "webhook"
)

// Reconcile steps, the step label of ReconcileErrors.
const (
	StepGet    = "get"
	StepWrite  = "write_status"
	StepDelete = "delete"
)

// Kinds of what an entry of a lock depends on, the kind label of EntryErrors.
const (
	EntrySession = "session"
	EntryPod     = "pod"
)

// collectors are every operator collector, in the order they are declared.
var collectors []prometheus.Collector

func add[C prometheus.Collector](c C) C {
	collectors = append(collectors, c)
	return c
}

func counter(subsystem, name, help string) prometheus.Counter {
	return add(prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Subsystem: subsystem, Name: name, Help: help}))
}

func counterVec(subsystem, name, help string, labels ...string) *prometheus.CounterVec {
	return add(prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: subsystem, Name: name, Help: help}, labels))
}

func gauge(name, help string) prometheus.Gauge {
	return add(prometheus.NewGauge(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: ControllerSubsystem, Name: name, Help: help}))
}

func histogram(name, help string, buckets []float64) prometheus.Histogram {
	return add(prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: Namespace, Subsystem: ControllerSubsystem, Name: name, Help: help, Buckets: buckets}))
}

const ctrl, hook = ControllerSubsystem, WebhookSubsystem

// Other is the value of an enumerated label for any value it does not list.
const Other = "other"

// TransitionKinds are the kind label's values of TransitionsObserved: an
// acquisition, and the end reasons the schema allows.
var TransitionKinds = []string{"Acquired", string(locksv1alpha1.EndReasonReleased), string(locksv1alpha1.EndReasonExpired),
	string(locksv1alpha1.EndReasonForceReleased), string(locksv1alpha1.EndReasonSessionExpired), string(locksv1alpha1.EndReasonSessionClosed)}

// EventReasons are the reasons of the controller's Events: the transitions',
// a dropped waiter's and an idle lock's deletion.
var EventReasons = append(slices.Clone(TransitionKinds), "WaiterDropped", "IdleLockDeleted")

// EnumCounterVec is a counter by one label of known values. An end reason
// comes from a stored lock, where the schema keeps it to those values unless
// the object was stored without it; any other value counts as Other, so
// that no string stored in a lock adds a series.
type EnumCounterVec struct {
	vec    *prometheus.CounterVec
	values []string
}

func enumCounterVec(subsystem, name, help, label string, values []string) EnumCounterVec {
	return EnumCounterVec{counterVec(subsystem, name, help, label), values}
}

// WithLabelValues is the counter of value, or of Other for a value not known.
func (e EnumCounterVec) WithLabelValues(value string) prometheus.Counter {
	if !slices.Contains(e.values, value) {
		value = Other
	}
	return e.vec.WithLabelValues(value)
}

// The operator's metrics: the exported ones are counted where they happen,
// the others through the helpers below. Each Help says what it counts.
var (
	Expirations    = counter(ctrl, "expirations_total", "Holdings, exclusive or shared, the controller expired (each entry on its own).")
	WaitersDropped = counterVec(ctrl, "waiters_dropped_total",
		"Waiters the controller removed from a queue, by reason (WaitTimeout, HandoffTimeout, SessionExpired, SessionClosed, PodDeleted).", "reason")
	IdleLocksDeleted    = counter(ctrl, "idle_locks_deleted_total", "Idle auto-created locks the controller deleted.")
	TransitionsObserved = enumCounterVec(ctrl, "transitions_observed_total",
		"Holdings, exclusive or shared, the controller observed begin (Acquired) or end, by kind (Acquired, Released, Expired, ForceReleased, SessionExpired, SessionClosed; other for a reason the schema does not know).", "kind", TransitionKinds)
	waitSeconds = histogram("wait_seconds",
		"Time from the controller first seeing a waiter queued to seeing it acquire the lock.",
		prometheus.ExponentialBuckets(0.01, 2, 16))
	handoffSeconds = histogram("handoff_seconds",
		"Time from the controller seeing a lock free with a head waiter to seeing that waiter acquire it.",
		prometheus.ExponentialBuckets(0.005, 2, 14))
	expiryDelay = histogram("expiry_delay_seconds",
		"Time from a holding's deadline on the controller's clock (its last renewal as the controller's cache received it, plus the lease and the grace) to the controller's write that expired it.",
		[]float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60})
	queueLength = histogram("queue_length",
		"Length of a lock's wait queue each time the controller observes an acquisition, exclusive or shared.",
		[]float64{0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024})
	locksObserved  = gauge("locks", "DistributedLocks this controller currently observes (0 on a replica that is not the leader).")
	locksHeld      = gauge("locks_held", "DistributedLocks this controller last observed with any holding, exclusive or shared.")
	holdingsByMode = add(prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: ControllerSubsystem, Name: "holdings",
		Help: "Holdings over all locks as this controller last observed them, by mode (exclusive: a Mutex's holder or an RWMutex's writer; shared: an RWMutex's readers and a Semaphore's permits)."},
		[]string{"mode"}))
	waiters         = gauge("waiters", "Waiters queued over all locks, as this controller last observed them.")
	ReconcileErrors = counterVec(ctrl, "reconcile_errors_total",
		"Reconciles that returned an error, by step (get, write_status, delete).", "step")
	EntryErrors = counterVec(ctrl, "entry_errors_total",
		"Reads of what an entry of a lock depends on that failed, by kind (session, pod): its entries were kept as they were, the rest of the lock decided, and the read retried with a backoff.", "kind")
	// One series per namespace that ever held a malformed lock: bounded by namespaces.
	LockDecodeErrors = counterVec(ctrl, "lock_decode_errors_total",
		"Versions of DistributedLocks the controller could not decode (e.g. a time Go's metav1 types do not parse) and left alone, by namespace; each malformed resourceVersion counts once.", "namespace")
	WriteConflicts   = counter(ctrl, "write_conflicts_total", "Controller writes that lost a race (409 Conflict) and were retried.")
	EventsSuppressed = enumCounterVec(ctrl, "events_suppressed_total",
		"Events not emitted because their lock exceeded its per-lock event rate, by reason (other for a reason the controller does not emit).", "reason", EventReasons)
	SessionsObserved = gauge("sessions", "LockSessions this controller currently observes (0 on a replica that is not the leader).")
	SessionsExpired  = counter(ctrl, "sessions_expired_total",
		"LockSessions the controller deleted after observing no renewal for their TTL plus grace (their holdings ended first).")
	isLeader           = gauge("is_leader", "1 while this replica holds the leader lease and runs the controller, else 0.")
	leaderChangesTotal = counter(ctrl, "leader_changes_total",
		"Times this replica became the leader; summed over replicas, the number of leader changes.")

	admissionDecisionsTotal = counterVec(hook, "admission_decisions_total",
		"Admission decisions on DistributedLock and fenced-object writes, by rule and outcome (allowed or denied); allowed requests count under rule \"none\".",
		"rule", "outcome")
	// Hot is the tracker behind every per-lock series: the hot locks' and
	// the webhook's stale tokens (kubelock_webhook_stale_token_rejections_total).
	Hot = add(newHotLocks(DefaultHotLocks, clock.RealClock{}))
	// Holdings reports the longest and the most overdue holding at each scrape.
	Holdings = add(&holdings{})
)

// Collectors returns every operator collector, for Register and for tests
// that check the dashboard names only exported metrics.
func Collectors() []prometheus.Collector { return slices.Clone(collectors) }

var registerOnce sync.Once

// Register adds the operator's metrics to controller-runtime's registry; the
// manager calls it (once per process: tests start several managers in one).
func Register() {
	registerOnce.Do(func() { ctrlmetrics.Registry.MustRegister(Collectors()...) })
}

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

// Expired records how late after its deadline the controller expired a
// holding (its write included).
func Expired(late time.Duration) { expiryDelay.Observe(max(0, late.Seconds())) }

// LockState is what the gauges need of one observed lock.
type LockState struct {
	Exists bool
	// Exclusive and Shared count its holdings by mode.
	Exclusive, Shared int
	Waiters           int
}

// Held reports whether the lock has any holding.
func (s LockState) Held() bool { return s.Exclusive+s.Shared > 0 }

// Modes, the mode label of the holdings gauge.
const (
	ModeExclusive = "exclusive"
	ModeShared    = "shared"
)

// LockChanged moves the fleet gauges from one observed state of a lock to the
// next; a lock seen for the first time has a zero before, a deleted lock a
// zero after.
func LockChanged(before, after LockState) {
	locksObserved.Add(b2f(after.Exists) - b2f(before.Exists))
	locksHeld.Add(b2f(after.Held()) - b2f(before.Held()))
	holdingsByMode.WithLabelValues(ModeExclusive).Add(float64(after.Exclusive - before.Exclusive))
	holdingsByMode.WithLabelValues(ModeShared).Add(float64(after.Shared - before.Shared))
	waiters.Add(float64(after.Waiters - before.Waiters))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

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
	outcome := "denied"
	if allowed {
		outcome, rule = "allowed", "none"
	}
	admissionDecisionsTotal.WithLabelValues(rule, outcome).Inc()
}

// HoldingStats summarises the current holdings as the controller observed them.
type HoldingStats struct {
	// LongestLeases is the age of the longest current holding in multiples of
	// its lease duration (since the controller first saw it).
	LongestLeases float64
	// MaxOverdueSeconds is how far the most overdue held lease is past its
	// expiry (lease + grace after the last observed renewal) without having
	// been expired; 0 when none is.
	MaxOverdueSeconds float64
}

// holdings is a collector that asks the controller for HoldingStats at each
// scrape, so no per-lock series and no periodic scan are needed.
type holdings struct {
	source atomic.Pointer[func() HoldingStats]
}

var (
	longestHoldingDesc = prometheus.NewDesc(prometheus.BuildFQName(Namespace, ControllerSubsystem, "longest_holding_leases"),
		"Age of the longest current holding in multiples of its lease duration, measured from when the controller first saw it.", nil, nil)
	maxOverdueDesc = prometheus.NewDesc(prometheus.BuildFQName(Namespace, ControllerSubsystem, "max_overdue_seconds"),
		"How far the most overdue held lease is past its expiry (lease + grace after the last observed renewal) without having been expired; 0 when none is.", nil, nil)
)

// SetHoldingSource sets the function the holding gauges are computed with at
// scrape time; the running controller sets it, nil reports zeros.
func SetHoldingSource(f func() HoldingStats) { Holdings.source.Store(&f) }

// Describe implements prometheus.Collector.
func (h *holdings) Describe(ch chan<- *prometheus.Desc) {
	ch <- longestHoldingDesc
	ch <- maxOverdueDesc
}

// Collect implements prometheus.Collector.
func (h *holdings) Collect(ch chan<- prometheus.Metric) {
	var s HoldingStats
	if f := h.source.Load(); f != nil && *f != nil {
		s = (*f)()
	}
	ch <- prometheus.MustNewConstMetric(longestHoldingDesc, prometheus.GaugeValue, s.LongestLeases)
	ch <- prometheus.MustNewConstMetric(maxOverdueDesc, prometheus.GaugeValue, s.MaxOverdueSeconds)
}
