package controllers

import (
	"fmt"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	"k8s.io/utils/lru"

	"github.com/kubelock/kubelock/internal/escape"
	"github.com/kubelock/kubelock/internal/metrics"
)

// The per-lock Event rate limit of the controller: a token bucket per lock
// holding up to DefaultEventBurst tokens, refilled with one token every
// DefaultEventInterval; DefaultEventLocks bounds how many locks' buckets are
// remembered, the least recently used forgotten first (and starting again
// with a full burst).
const (
	DefaultEventBurst    = 20
	DefaultEventInterval = 10 * time.Second
	DefaultEventLocks    = 10000
)

// EventLimit configures a per-lock Event rate limit: a token bucket per lock
// holding up to Burst tokens, refilled with one every Interval, for at most
// Locks locks. A zero Burst turns the limit off.
type EventLimit struct {
	Burst    int
	Interval time.Duration
	Locks    int
}

// RateLimitedRecorder passes Events on to a recorder unless the object they
// regard has used up its token bucket, so a hot lock cannot flood the event
// store. Suppressed Events are counted in
// kubelock_controller_events_suppressed_total{reason}.
type RateLimitedRecorder struct {
	next  events.EventRecorder
	limit EventLimit
	clock clock.PassiveClock

	mu sync.Mutex // makes the get-or-add of a bucket one step
	// buckets holds a *rate.Limiter per lock, the least recently used forgotten first.
	buckets *lru.Cache
}

// NewRateLimitedRecorder wraps next with the per-object limit l, measured on clk.
func NewRateLimitedRecorder(next events.EventRecorder, l EventLimit, clk clock.PassiveClock) *RateLimitedRecorder {
	return &RateLimitedRecorder{next: next, limit: l, clock: clk, buckets: lru.New(l.Locks)}
}

// NoteLimit is the longest Event note the apiserver stores (events.k8s.io/v1
// refuses a longer one, and the Event is lost).
const NoteLimit = 1024

// Eventf implements events.EventRecorder. It formats the note itself, its
// control and format characters escaped and its length cut to NoteLimit:
// the identities, users, pod and session names in it come from whoever wrote
// the lock, and an Event refused for its length would hide what it reports.
func (r *RateLimitedRecorder) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any) {
	if !r.allow(regarding) {
		metrics.EventsSuppressed.WithLabelValues(reason).Inc()
		return
	}
	r.next.Eventf(regarding, related, eventtype, reason, action, "%s", eventNote(note, args...))
}

// eventNote is the note an Event stores: printable, at most NoteLimit bytes.
func eventNote(format string, args ...any) string {
	return escape.Clip(escape.Printable(fmt.Sprintf(format, args...)), NoteLimit)
}

// allow takes a token from the bucket of obj, if there is one; a lock not
// seen before (or forgotten) starts with a full bucket.
func (r *RateLimitedRecorder) allow(obj runtime.Object) bool {
	if r.limit.Burst <= 0 {
		return true
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return true
	}
	key := types.NamespacedName{Namespace: m.GetNamespace(), Name: m.GetName()}
	r.mu.Lock()
	defer r.mu.Unlock()
	b, ok := r.buckets.Get(key)
	if !ok {
		b = rate.NewLimiter(rate.Every(r.limit.Interval), r.limit.Burst)
		r.buckets.Add(key, b)
	}
	lim, _ := b.(*rate.Limiter) // the cache holds only limiters
	return lim.AllowN(r.clock.Now(), 1)
}

// EventPolicy says which transitions the controller reports as Events. Every
// Event is an apiserver write the whole cluster pays for, so by default only
// what a person must see is one; the metrics count every transition either way.
type EventPolicy string

const (
	// EventsImportant (the default) reports expiries, force-releases, the
	// ends of holdings with their session, dropped waiters and idle-lock
	// deletions; acquisitions and releases only count in
	// kubelock_controller_transitions_observed_total.
	EventsImportant EventPolicy = "important"
	// EventsAll reports one Event per transition, acquisitions and releases too.
	EventsAll EventPolicy = "all"
)

// ParseEventPolicy reads a policy by its name, as the manager's --events flag gives it.
func ParseEventPolicy(s string) (EventPolicy, error) {
	switch p := EventPolicy(s); p {
	case EventsImportant, EventsAll:
		return p, nil
	}
	return "", fmt.Errorf("controllers: events must be %q or %q, got %q", EventsImportant, EventsAll, s)
}

// reports says whether an Event with this reason is emitted under p.
func (p EventPolicy) reports(reason string) bool {
	return p == EventsAll || (reason != EventAcquired && reason != EventReleased)
}
