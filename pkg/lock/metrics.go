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
	opAcquire      = "acquire"
	opTryAcquire   = "try_acquire"
	opRenew        = "renew"
	opRelease      = "release"
	opForceRelease = "force_release"
)

// Outcome label values of kubelock_client_operation_duration_seconds.
const (
	// outcomeSuccess: the apiserver committed the operation.
	outcomeSuccess = "success"
	// outcomeLocked: TryAcquire found the lock held or others queued.
	outcomeLocked = "locked"
	// outcomeTimeout: the wait ran out (ErrTimeout) or the caller's deadline passed.
	outcomeTimeout = "timeout"
	// outcomeCanceled: the caller cancelled the context.
	outcomeCanceled = "canceled"
	// outcomeLost: the holding is over or cannot be proven (ErrLockLost).
	outcomeLost = "lost"
	// outcomeQueueFull: the wait queue is at spec.maxWaiters.
	outcomeQueueFull = "queue_full"
	// outcomeNotFound: the lock does not exist and auto-creation is off.
	outcomeNotFound = "not_found"
	// outcomeConflict: a write lost a race and was not retried.
	outcomeConflict = "conflict"
	// outcomeDenied: admission or RBAC refused the write (403, 422, 400, 401).
	outcomeDenied = "denied"
	// outcomeUnknown: the request failed without a definite answer (timeout,
	// lost connection, 5xx): the write may have committed.
	outcomeUnknown = "unknown"
	// outcomeError: anything else, such as invalid arguments.
	outcomeError = "error"
)

// Cause label values of kubelock_client_locks_lost_total.
const (
	// lostExpired: the controller expired the lease.
	lostExpired = "expired"
	// lostForceReleased: someone with the force-release verb broke the lock.
	lostForceReleased = "force_released"
	// lostDeadline: renewals did not succeed before the safe deadline (I5).
	lostDeadline = "deadline"
	// lostDeleted: the lock object was deleted.
	lostDeleted = "deleted"
	// lostReleased: the holding was released by another process (release --lease-id).
	lostReleased = "released"
	// lostSession: the holding's session ended (closed, deleted or lapsed).
	lostSession = "session"
	// lostReplaced: the holding is gone and status no longer says how.
	lostReplaced = "replaced"
)

// metrics are the client library's Prometheus metrics, enabled with
// WithMetrics. Clients that share a registerer share the series. A nil
// *metrics records nothing.
type metrics struct {
	duration  *prometheus.HistogramVec
	wait      prometheus.Histogram
	hold      prometheus.Histogram
	lost      *prometheus.CounterVec
	conflicts *prometheus.CounterVec
	held      prometheus.Gauge
}

// newMetrics creates the client metrics and registers them with reg. When reg
// already holds them (another client registered first) the registered ones are
// used, so every client of a process counts into the same series.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
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
	if err := errors.Join(registerOrGet(reg, &m.duration), registerOrGet(reg, &m.wait), registerOrGet(reg, &m.hold),
		registerOrGet(reg, &m.lost), registerOrGet(reg, &m.conflicts), registerOrGet(reg, &m.held)); err != nil {
		return nil, err
	}
	return m, nil
}

// registerOrGet registers *c with reg, or points *c at the collector reg already holds.
func registerOrGet[C prometheus.Collector](reg prometheus.Registerer, c *C) error {
	err := reg.Register(*c)
	if are, ok := errors.AsType[prometheus.AlreadyRegisteredError](err); ok {
		if existing, ok := are.ExistingCollector.(C); ok {
			*c = existing
			return nil
		}
	}
	return err
}

// timed starts timing op; call what it returns with the operation's error
// when the operation ends. Without metrics it costs nothing.
func (c *Client) timed(op string) func(*error) {
	if c.metrics == nil {
		return func(*error) {}
	}
	start := c.cfg.clock.Now()
	return func(err *error) { c.metrics.operation(op, start, c.cfg.clock.Now(), *err) }
}

// operation records one operation that started at start and ended with err.
func (m *metrics) operation(op string, start time.Time, now time.Time, err error) {
	if m == nil {
		return
	}
	m.duration.WithLabelValues(op, outcomeOf(err)).Observe(now.Sub(start).Seconds())
}

func (m *metrics) conflict(op string) {
	if m != nil {
		m.conflicts.WithLabelValues(op).Inc()
	}
}

func (m *metrics) waited(d time.Duration) {
	if m != nil {
		m.wait.Observe(d.Seconds())
	}
}

func (m *metrics) acquired() {
	if m != nil {
		m.held.Inc()
	}
}

// ended records the end of a holding that lasted d; cause is "" for a release.
func (m *metrics) ended(d time.Duration, cause string) {
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
		return outcomeSuccess
	case errors.As(err, &locked) || errors.Is(err, ErrLocked):
		return outcomeLocked
	case errors.Is(err, ErrLockLost):
		return outcomeLost
	case errors.Is(err, ErrQueueFull):
		return outcomeQueueFull
	case errors.Is(err, ErrNotFound):
		return outcomeNotFound
	case errors.Is(err, context.DeadlineExceeded):
		return outcomeTimeout
	case errors.Is(err, context.Canceled):
		return outcomeCanceled
	case apierrors.IsConflict(err):
		return outcomeConflict
	case definite(err):
		return outcomeDenied
	case apierrors.ReasonForError(err) != "" || isTransport(err):
		return outcomeUnknown
	}
	return outcomeError
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
	return lostReplaced
}
