package controllers

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	testingclock "k8s.io/utils/clock/testing"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/internal/escape"
	"github.com/kubelock/kubelock/internal/metrics"
	"github.com/kubelock/kubelock/test/testmetrics"
)

func lockNamed(ns, name string) *locksv1alpha1.DistributedLock {
	return &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
}

// drain returns the Events the fake recorder received so far.
func drain(f *events.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-f.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// TestRateLimitedRecorder: a hot lock gets its burst and then one Event per
// interval; other locks are unaffected; suppressed Events are counted.
func TestRateLimitedRecorder(t *testing.T) {
	clk := testingclock.NewFakePassiveClock(time.Unix(1_700_000_000, 0))
	fake := events.NewFakeRecorder(1000)
	r := NewRateLimitedRecorder(fake, EventLimit{Burst: 3, Interval: 10 * time.Second, Locks: 100}, clk)
	metrics.Register()
	suppressed := func() float64 {
		v, err := testmetrics.Value(ctrlmetrics.Registry, "kubelock_controller_events_suppressed_total", map[string]string{"reason": EventAcquired})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	before := suppressed()

	hot, cold := lockNamed("ns", "hot"), lockNamed("ns", "cold")
	for i := range 50 {
		r.Eventf(hot, nil, corev1.EventTypeNormal, EventAcquired, "Acquire", "acquired %d", i)
	}
	r.Eventf(cold, nil, corev1.EventTypeNormal, EventAcquired, "Acquire", "acquired")
	got := drain(fake)
	want := []string{"Normal Acquired acquired 0", "Normal Acquired acquired 1", "Normal Acquired acquired 2", "Normal Acquired acquired"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("events = %q, want %q", got, want)
	}
	if d := suppressed() - before; d != 47 {
		t.Fatalf("suppressed = %v, want 47", d)
	}

	// 25s later the hot lock has earned two tokens (one every 10s).
	clk.SetTime(clk.Now().Add(25 * time.Second))
	for i := range 5 {
		r.Eventf(hot, nil, corev1.EventTypeNormal, EventAcquired, "Acquire", "later %d", i)
	}
	if got := drain(fake); len(got) != 2 {
		t.Fatalf("events after 25s = %q, want 2", got)
	}
	// The burst never grows beyond its size however long the lock is quiet.
	clk.SetTime(clk.Now().Add(time.Hour))
	for i := range 10 {
		r.Eventf(hot, nil, corev1.EventTypeNormal, EventAcquired, "Acquire", "much later %d", i)
	}
	if got := drain(fake); len(got) != 3 {
		t.Fatalf("events after an hour = %q, want 3", got)
	}
}

// TestRateLimitedRecorderBound: buckets are kept for at most Locks locks; the
// least recently used goes first.
func TestRateLimitedRecorderBound(t *testing.T) {
	clk := testingclock.NewFakePassiveClock(time.Unix(1_700_000_000, 0))
	fake := events.NewFakeRecorder(100000)
	r := NewRateLimitedRecorder(fake, EventLimit{Burst: 1, Interval: time.Hour, Locks: 100}, clk)
	for i := range 10000 {
		r.Eventf(lockNamed("ns", fmt.Sprintf("l%d", i)), nil, corev1.EventTypeNormal, EventAcquired, "Acquire", "x")
	}
	if got := r.buckets.Len(); got != 100 {
		t.Fatalf("buckets = %d, want 100", got)
	}
	if got := len(drain(fake)); got != 10000 {
		t.Fatalf("events = %d, want one per lock", got)
	}
	// l9999 is recent and empty; l0 was forgotten and starts full again.
	r.Eventf(lockNamed("ns", "l9999"), nil, corev1.EventTypeNormal, EventAcquired, "Acquire", "x")
	r.Eventf(lockNamed("ns", "l0"), nil, corev1.EventTypeNormal, EventAcquired, "Acquire", "x")
	if got := drain(fake); len(got) != 1 {
		t.Fatalf("events = %q, want only l0's", got)
	}
}

// TestRateLimitOff: a zero burst passes everything on.
func TestRateLimitOff(t *testing.T) {
	fake := events.NewFakeRecorder(100)
	r := NewRateLimitedRecorder(fake, EventLimit{}, testingclock.NewFakePassiveClock(time.Now()))
	for range 50 {
		r.Eventf(lockNamed("ns", "a"), nil, corev1.EventTypeNormal, EventAcquired, "Acquire", "x")
	}
	if got := len(drain(fake)); got != 50 {
		t.Fatalf("events = %d, want 50", got)
	}
}

// TestEventPolicy: by default only what a person must see is an Event;
// EventsAll reports acquisitions and releases too; other names are refused.
func TestEventPolicy(t *testing.T) {
	important := []string{EventExpired, EventForceReleased, EventSessionExpired, EventSessionClosed, EventWaiterDropped, EventDeleted}
	for _, reason := range important {
		if !EventsImportant.reports(reason) || !EventsAll.reports(reason) {
			t.Errorf("%s is not reported by both policies", reason)
		}
	}
	for _, reason := range []string{EventAcquired, EventReleased} {
		if EventsImportant.reports(reason) {
			t.Errorf("EventsImportant reports %s", reason)
		}
		if !EventsAll.reports(reason) {
			t.Errorf("EventsAll does not report %s", reason)
		}
	}
	for _, name := range []string{"important", "all"} {
		if p, err := ParseEventPolicy(name); err != nil || string(p) != name {
			t.Errorf("ParseEventPolicy(%q) = %q, %v", name, p, err)
		}
	}
	for _, name := range []string{"", "All", "none"} {
		if _, err := ParseEventPolicy(name); err == nil {
			t.Errorf("ParseEventPolicy(%q) succeeded", name)
		}
	}
}

// TestEventNotesArePrintableAndFit: a note quotes names other users wrote; it
// reaches the event store escaped and within the apiserver's limit, so the
// Event is neither a terminal escape for whoever reads it nor refused.
func TestEventNotesArePrintableAndFit(t *testing.T) {
	clk := testingclock.NewFakePassiveClock(time.Unix(1_700_000_000, 0))
	fake := events.NewFakeRecorder(10)
	r := NewRateLimitedRecorder(fake, EventLimit{}, clk)
	identity := strings.Repeat("\U0001F512", 253) // the schema's longest identity: 1,012 bytes
	r.Eventf(lockNamed("ns", "db"), nil, corev1.EventTypeNormal, EventForceReleased, "Observe",
		"holding of %s with fencing token %d ended: %s by %s", identity, 7, EventForceReleased, "mallory\x1b]0;owned\x07\u202e")
	r.Eventf(lockNamed("ns", "db"), nil, corev1.EventTypeNormal, EventForceReleased, "Observe",
		"holding of %s ended by %s", "worker", "mallory\x1b[2J\u202e")
	got := drain(fake)
	if len(got) != 2 {
		t.Fatalf("events = %q", got)
	}
	const prefix = "Normal " + EventForceReleased + " "
	long, short := strings.TrimPrefix(got[0], prefix), strings.TrimPrefix(got[1], prefix)
	if len(long) > NoteLimit || !strings.HasPrefix(long, "holding of "+identity[:4]) || !strings.HasSuffix(long, escape.Ellipsis) {
		t.Errorf("a long note is %d bytes (limit %d): %.80q…", len(long), NoteLimit, long)
	}
	if want := `holding of worker ended by mallory\x1b[2J\u202e`; short != want {
		t.Errorf("note = %q, want %q", short, want)
	}
}

// TestEventReasonsAreKnownToMetrics: the metrics count every reason the
// controller emits under its own name, not as "other".
func TestEventReasonsAreKnownToMetrics(t *testing.T) {
	for _, r := range []string{EventAcquired, EventReleased, EventExpired, EventSessionExpired, EventSessionClosed, EventForceReleased, EventWaiterDropped, EventDeleted} {
		if !slices.Contains(metrics.EventReasons, r) {
			t.Errorf("Event reason %s is not in metrics.EventReasons", r)
		}
	}
	for _, r := range []string{EventAcquired, EventReleased, EventExpired, EventSessionExpired, EventSessionClosed, EventForceReleased} {
		if !slices.Contains(metrics.TransitionKinds, r) {
			t.Errorf("transition %s is not in metrics.TransitionKinds", r)
		}
	}
}
