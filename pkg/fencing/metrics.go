package fencing

import (
	"context"
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics counts what a protected resource refused. It is opt-in: build it
// with NewMetrics and wrap the Store with Metrics.Store (Middleware, or any
// Store user) or pass it to postgres.NewGuard with postgres.WithMetrics
// (Guard.Do). A nil *Metrics records nothing.
type Metrics struct {
	rejections prometheus.Counter
}

// NewMetrics registers kubelock_fencing_stale_token_rejections_total with reg,
// or reuses the counter already registered there.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	c := prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "kubelock",
		Subsystem: "fencing",
		Name:      "stale_token_rejections_total",
		Help:      "Operations a protected resource refused because a higher fencing token was already accepted for their lock.",
	})
	if err := reg.Register(c); err != nil {
		are, ok := errors.AsType[prometheus.AlreadyRegisteredError](err)
		if !ok {
			return nil, err
		}
		if c, ok = are.ExistingCollector.(prometheus.Counter); !ok {
			return nil, err
		}
	}
	return &Metrics{rejections: c}, nil
}

// Collectors returns the collectors of m (tests and custom registries).
func (m *Metrics) Collectors() []prometheus.Collector { return []prometheus.Collector{m.rejections} }

// Count counts err if it is a stale-token rejection, and returns it.
func (m *Metrics) Count(err error) error {
	if m != nil && errors.Is(err, ErrStaleToken) {
		m.rejections.Inc()
	}
	return err
}

// Store wraps s so that its stale-token rejections are counted.
func (m *Metrics) Store(s Store) Store { return &countingStore{Store: s, m: m} }

type countingStore struct {
	Store
	m *Metrics
}

// Accept implements Store.
func (s *countingStore) Accept(ctx context.Context, lock string, token int64) error {
	return s.m.Count(s.Store.Accept(ctx, lock, token))
}
