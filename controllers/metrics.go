package controllers

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Metrics of the controller, served on the manager's metrics endpoint. Every
// duration is measured on the controller's own clock, from what it observed.
var (
	expirationsTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kubelock_controller_expirations_total",
		Help: "Leases the controller expired.",
	})
	waitersDroppedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kubelock_controller_waiters_dropped_total",
		Help: "Waiters the controller removed from a queue, by reason (WaitTimeout, HandoffTimeout).",
	}, []string{"reason"})
	idleLocksDeletedTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kubelock_controller_idle_locks_deleted_total",
		Help: "Idle auto-created locks the controller deleted.",
	})
	transitionsObservedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kubelock_controller_transitions_observed_total",
		Help: "Changes of holder the controller observed, by kind (Acquired, Released, Expired, ForceReleased).",
	}, []string{"kind"})
	waitSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "kubelock_controller_wait_seconds",
		Help:    "Time from the controller first seeing a waiter queued to seeing it acquire the lock.",
		Buckets: prometheus.ExponentialBuckets(0.01, 2, 16),
	})
	handoffSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "kubelock_controller_handoff_seconds",
		Help:    "Time from the controller seeing a lock free with a head waiter to seeing that waiter acquire it.",
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
	})
	queueLength = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "kubelock_controller_queue_length",
		Help:    "Length of a lock's wait queue each time the controller observes a change of holder.",
		Buckets: []float64{0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024},
	})
)

func init() {
	metrics.Registry.MustRegister(expirationsTotal, waitersDroppedTotal, idleLocksDeletedTotal,
		transitionsObservedTotal, waitSeconds, handoffSeconds, queueLength)
}
