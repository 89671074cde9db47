package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

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
	mu     sync.Mutex
	source func() HoldingStats
}

var (
	longestHoldingDesc = prometheus.NewDesc(prometheus.BuildFQName(Namespace, ControllerSubsystem, "longest_holding_leases"),
		"Age of the longest current holding in multiples of its lease duration, measured from when the controller first saw it.", nil, nil)
	maxOverdueDesc = prometheus.NewDesc(prometheus.BuildFQName(Namespace, ControllerSubsystem, "max_overdue_seconds"),
		"How far the most overdue held lease is past its expiry (lease + grace after the last observed renewal) without having been expired; 0 when none is.", nil, nil)
)

// SetHoldingSource sets the function the holding gauges are computed with at
// scrape time; the running controller sets it, nil reports zeros.
func SetHoldingSource(f func() HoldingStats) {
	Holdings.mu.Lock()
	defer Holdings.mu.Unlock()
	Holdings.source = f
}

// Describe implements prometheus.Collector.
func (h *holdings) Describe(ch chan<- *prometheus.Desc) {
	ch <- longestHoldingDesc
	ch <- maxOverdueDesc
}

// Collect implements prometheus.Collector.
func (h *holdings) Collect(ch chan<- prometheus.Metric) {
	h.mu.Lock()
	f := h.source
	h.mu.Unlock()
	var s HoldingStats
	if f != nil {
		s = f()
	}
	ch <- prometheus.MustNewConstMetric(longestHoldingDesc, prometheus.GaugeValue, s.LongestLeases)
	ch <- prometheus.MustNewConstMetric(maxOverdueDesc, prometheus.GaugeValue, s.MaxOverdueSeconds)
}
