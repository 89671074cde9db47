package lock

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// Client metrics, enabled with WithMetrics. All names start with
// kubelock_client_; docs/observability.md lists them with their labels.
const (
	metricsNamespace = "kubelock"
	metricsSubsystem = "client"
)

// Operation label values of kubelock_client_operation_duration_seconds and
// kubelock_client_conflicts_total.
const (
	OpAcquire      = "acquire"
	OpTryAcquire   = "try_acquire"
	OpRenew        = "renew"
	OpRelease      = "release"
	OpForceRelease = "force_release"
)

// Outcome label values of kubelock_client_operation_duration_seconds.
const (
	// OutcomeSuccess: the apiserver committed the operation.
	OutcomeSuccess = "success"
	// OutcomeLocked: TryAcquire found the lock held or others queued.
	OutcomeLocked = "locked"
	// OutcomeTimeout: the wait ran out (ErrTimeout) or the caller's deadline passed.
	OutcomeTimeout = "timeout"
	// OutcomeCanceled: the caller cancelled the context.
	OutcomeCanceled = "canceled"
	// OutcomeLost: the holding is over or cannot be proven (ErrLockLost).
	OutcomeLost = "lost"
	// OutcomeQueueFull: the wait queue is at spec.maxWaiters.
	OutcomeQueueFull = "queue_full"
	// OutcomeNotFound: the lock does not exist and auto-creation is off.
	OutcomeNotFound = "not_found"
	// OutcomeConflict: a write lost a race and was not retried.
	OutcomeConflict = "conflict"
	// OutcomeDenied: admission or RBAC refused the write (403, 422, 400, 401).
	OutcomeDenied = "denied"
	// OutcomeUnknown: the request failed without a definite answer (timeout,
	// lost connection, 5xx): the write may have committed.
	OutcomeUnknown = "unknown"
	// OutcomeError: anything else, such as invalid arguments.
	OutcomeError = "error"
)

// Cause label values of kubelock_client_locks_lost_total.
const (
	// LostExpired: the controller expired the lease.
	LostExpired = "expired"
	// LostForceReleased: someone with the force-release verb broke the lock.
	LostForceReleased = "force_released"
	// LostDeadline: renewals did not succeed before the safe deadline (I5).
	LostDeadline = "deadline"
	// LostDeleted: the lock object was deleted.
	LostDeleted = "deleted"
	// LostReleased: the holding was released by another process (release --lease-id).
	LostReleased = "released"
	// LostReplaced: the holding is gone and status no longer says how.
	LostReplaced = "replaced"
)

// Metrics are the client library's Prometheus metrics. Clients that share a
// registerer share one Metrics. A nil *Metrics records nothing.
type Metrics struct {
	duration  *prometheus.HistogramVec
	wait      prometheus.Histogram
	hold      prometheus.Histogram
	lost      *prometheus.CounterVec
	conflicts *prometheus.CounterVec
	held      prometheus.Gauge
}

// NewMetrics creates the client metrics and registers them with reg. When reg
// already holds them (another client registered first) the registered ones are
// used, so every client of a process counts into the same series.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: metricsNamespace, Subsystem: metricsSubsystem,
			Name:    "operation_duration_seconds",
			Help:    "Duration of lock operations as the caller saw them, by operation (acquire, try_acquire, renew, release, force_release) and outcome (success, locked, timeout, canceled, lost, queue_full, not_found, conflict, denied, unknown, error). Acquire includes the wait in the queue.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}, []string{"operation", "outcome"}),
		wait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: metricsNamespace, Subsystem: metricsSubsystem,
			Name:    "wait_seconds",
			Help:    "Time successful Acquires spent queued, from joining the wait queue to taking the lock.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 18),
		}),
		hold: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: metricsNamespace, Subsystem: metricsSubsystem,
			Name:    "hold_seconds",
			Help:    "Time from acquiring a lock to the end of the holding (released or lost), on this client's clock.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 22),
		}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricsNamespace, Subsystem: metricsSubsystem,
			Name: "locks_lost_total",
			Help: "Holdings that ended without the holder releasing them, by cause (expired, force_released, deadline, deleted, released, replaced).",
		}, []string{"cause"}),
		conflicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricsNamespace, Subsystem: metricsSubsystem,
			Name: "conflicts_total",
			Help: "Lock writes that lost a race (409 Conflict) and were retried after rereading, by operation.",
		}, []string{"operation"}),
		held: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Subsystem: metricsSubsystem,
			Name: "locks_held",
			Help: "Holdings this process has now.",
		}),
	}
	var err error
	m.duration, err = registerOrGet(reg, m.duration)
	if err == nil {
		m.wait, err = registerOrGet(reg, m.wait)
	}
	if err == nil {
		m.hold, err = registerOrGet(reg, m.hold)
	}
	if err == nil {
		m.lost, err = registerOrGet(reg, m.lost)
	}
	if err == nil {
		m.conflicts, err = registerOrGet(reg, m.conflicts)
	}
	if err == nil {
		m.held, err = registerOrGet(reg, m.held)
	}
	if err != nil {
		return nil, err
	}
	return m, nil
}

// Collectors returns the collectors of m (tests and custom registries).
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.duration, m.wait, m.hold, m.lost, m.conflicts, m.held}
}

func registerOrGet[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	if are, ok := errors.AsType[prometheus.AlreadyRegisteredError](err); ok {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, err
}

// operation records one operation that started at start and ended with err.
func (m *Metrics) operation(op string, start time.Time, now time.Time, err error) {
	if m == nil {
		return
	}
	m.duration.WithLabelValues(op, outcomeOf(err)).Observe(now.Sub(start).Seconds())
}

func (m *Metrics) conflict(op string) {
	if m != nil {
		m.conflicts.WithLabelValues(op).Inc()
	}
}

func (m *Metrics) waited(d time.Duration) {
	if m != nil {
		m.wait.Observe(d.Seconds())
	}
}

func (m *Metrics) acquired() {
	if m != nil {
		m.held.Inc()
	}
}

// ended records the end of a holding that lasted d; cause is "" for a release.
func (m *Metrics) ended(d time.Duration, cause string) {
	if m == nil {
		return
	}
	m.held.Dec()
	m.hold.Observe(d.Seconds())
	if cause != "" {
		m.lost.WithLabelValues(cause).Inc()
	}
}

// outcomeOf classifies an operation's error for the outcome label.
func outcomeOf(err error) string {
	var locked *LockedError
	switch {
	case err == nil:
		return OutcomeSuccess
	case errors.As(err, &locked) || errors.Is(err, ErrLocked):
		return OutcomeLocked
	case errors.Is(err, ErrLockLost):
		return OutcomeLost
	case errors.Is(err, ErrQueueFull):
		return OutcomeQueueFull
	case errors.Is(err, ErrNotFound):
		return OutcomeNotFound
	case errors.Is(err, context.DeadlineExceeded):
		return OutcomeTimeout
	case errors.Is(err, context.Canceled):
		return OutcomeCanceled
	case apierrors.IsConflict(err):
		return OutcomeConflict
	case definite(err):
		return OutcomeDenied
	case apierrors.ReasonForError(err) != "" || isTransport(err):
		return OutcomeUnknown
	}
	return OutcomeError
}

// isTransport reports whether err came from talking to the apiserver rather
// than from the arguments: a URL or network error.
func isTransport(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t)
}

// lostCause names the cause of a lost holding for kubelock_client_locks_lost_total.
func lostCause(err error) string {
	if le, ok := errors.AsType[*lostError](err); ok && le.cause != "" {
		return le.cause
	}
	return LostReplaced
}
