package v1alpha1_test

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1 "github.com/kubelock/kubelock/api/v1alpha1"
)

func TestNextFencingToken(t *testing.T) {
	cases := []struct {
		rv      string
		want    int64
		wantErr bool
	}{
		{rv: "1", want: 2},
		{rv: "4711", want: 4712},
		{rv: strconv.FormatInt(math.MaxInt64-1, 10), want: math.MaxInt64},
		{rv: strconv.FormatInt(math.MaxInt64, 10), wantErr: true}, // the next token would overflow
		{rv: "99999999999999999999", wantErr: true},               // beyond int64
		{rv: "", wantErr: true},
		{rv: "0", wantErr: true},
		{rv: "012", wantErr: true},
		{rv: "-5", wantErr: true},
		{rv: "12a", wantErr: true},
		{rv: " 12", wantErr: true},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%q", c.rv), func(t *testing.T) {
			got, err := locksv1.NextFencingToken(c.rv)
			if c.wantErr {
				if err == nil {
					t.Fatalf("NextFencingToken(%q) = %d, want an error", c.rv, got)
				}
				return
			}
			if err != nil {
				t.Fatalf("NextFencingToken(%q): %v", c.rv, err)
			}
			if got != c.want {
				t.Fatalf("NextFencingToken(%q) = %d, want %d", c.rv, got, c.want)
			}
		})
	}
}

// finished is the n-th finished holding, as EndHolding records it.
func finished(n int, endedBy string, at metav1.MicroTime) locksv1.FinishedHolding {
	h := holder("alice", n)
	return locksv1.FinishedHolding{
		RequestID: h.RequestID, LeaseID: h.LeaseID, FencingToken: int64(n * 10),
		Identity: h.Identity, EndTime: at, EndReason: locksv1.EndReasonReleased, EndedBy: endedBy,
	}
}

func TestEndHolding(t *testing.T) {
	at := metav1.NewMicroTime(time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC))
	history := func(from, to int) []locksv1.FinishedHolding {
		var out []locksv1.FinishedHolding
		for n := from; n <= to; n++ {
			out = append(out, finished(n, "alice", at))
		}
		return out
	}
	cases := []struct {
		name     string
		previous []locksv1.FinishedHolding
		want     []locksv1.FinishedHolding
	}{
		{name: "first holding", previous: nil, want: history(100, 100)},
		{name: "appends at the end", previous: history(1, 3), want: append(history(1, 3), finished(100, "alice", at))},
		{name: "fills up to 8", previous: history(1, 7), want: append(history(1, 7), finished(100, "alice", at))},
		{name: "drops the oldest beyond 8", previous: history(1, 8), want: append(history(2, 8), finished(100, "alice", at))},
		{name: "trims an over-long history to 8", previous: history(1, 12), want: append(history(6, 12), finished(100, "alice", at))},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := holder("alice", 100)
			l := &locksv1.DistributedLock{Status: locksv1.DistributedLockStatus{
				Holder: &h, FencingToken: 1000, Transitions: 5, RecentAcquisitions: c.previous,
			}}
			l.Generation = 3
			l.EndHolding(locksv1.EndReasonReleased, "alice", at)

			if l.Status.Holder != nil {
				t.Errorf("holder = %+v, want none", l.Status.Holder)
			}
			want := c.want
			want[len(want)-1].FencingToken = 1000
			if diff := cmp.Diff(want, l.Status.RecentAcquisitions); diff != "" {
				t.Errorf("recentAcquisitions (-want +got):\n%s", diff)
			}
			if l.Status.FencingToken != 1000 || l.Status.Transitions != 5 {
				t.Errorf("token, transitions = %d, %d; want them unchanged at 1000, 5", l.Status.FencingToken, l.Status.Transitions)
			}
			if len(l.Status.Conditions) != 1 || l.Status.Conditions[0].Status != metav1.ConditionFalse ||
				l.Status.Conditions[0].Reason != string(locksv1.EndReasonReleased) || l.Status.Conditions[0].ObservedGeneration != 3 {
				t.Errorf("conditions = %+v, want Held=False reason Released at generation 3", l.Status.Conditions)
			}
		})
	}

	t.Run("a free lock stays as it is", func(t *testing.T) {
		l := &locksv1.DistributedLock{Status: locksv1.DistributedLockStatus{FencingToken: 7, RecentAcquisitions: history(1, 2)}}
		want := l.DeepCopy()
		l.EndHolding(locksv1.EndReasonExpired, "controller", at)
		if diff := cmp.Diff(want, l); diff != "" {
			t.Errorf("free lock changed (-want +got):\n%s", diff)
		}
	})

	t.Run("records the reason and who ended it", func(t *testing.T) {
		h := holder("alice", 1)
		l := &locksv1.DistributedLock{Status: locksv1.DistributedLockStatus{Holder: &h, FencingToken: 9}}
		l.EndHolding(locksv1.EndReasonForceReleased, "admin", at)
		got := l.Status.RecentAcquisitions[0]
		if got.EndReason != locksv1.EndReasonForceReleased || got.EndedBy != "admin" || got.FencingToken != 9 || got.LeaseID != h.LeaseID {
			t.Errorf("finished holding = %+v", got)
		}
	})
}

func TestRemoveWaiter(t *testing.T) {
	queue := func(ns ...int) []locksv1.Waiter {
		var out []locksv1.Waiter
		for _, n := range ns {
			w := waiter("bob", n)
			w.EnqueueTime = metav1.MicroTime{}
			w.Deadline = metav1.MicroTime{}
			out = append(out, w)
		}
		return out
	}
	cases := []struct {
		name      string
		queue     []locksv1.Waiter
		requestID string
		wantOK    bool
		want      []locksv1.Waiter
	}{
		{name: "head", queue: queue(1, 2, 3), requestID: "req-1", wantOK: true, want: queue(2, 3)},
		{name: "middle", queue: queue(1, 2, 3), requestID: "req-2", wantOK: true, want: queue(1, 3)},
		{name: "tail", queue: queue(1, 2, 3), requestID: "req-3", wantOK: true, want: queue(1, 2)},
		{name: "only waiter leaves an empty queue", queue: queue(1), requestID: "req-1", wantOK: true, want: nil},
		{name: "not queued", queue: queue(1, 2), requestID: "req-9", wantOK: false, want: queue(1, 2)},
		{name: "empty queue", queue: nil, requestID: "req-1", wantOK: false, want: nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			original := append([]locksv1.Waiter(nil), c.queue...)
			s := &locksv1.DistributedLockStatus{Waiters: c.queue, WaiterCount: int32(len(c.queue))}
			if ok := s.RemoveWaiter(c.requestID); ok != c.wantOK {
				t.Errorf("RemoveWaiter(%q) = %v, want %v", c.requestID, ok, c.wantOK)
			}
			if diff := cmp.Diff(c.want, s.Waiters); diff != "" {
				t.Errorf("waiters (-want +got):\n%s", diff)
			}
			if int(s.WaiterCount) != len(s.Waiters) {
				t.Errorf("waiterCount = %d, want %d", s.WaiterCount, len(s.Waiters))
			}
			// The caller's slice is not modified in place: a copy read before the
			// write (an informer's cache, a retry) must keep the queue it saw.
			if diff := cmp.Diff(original, c.queue); diff != "" {
				t.Errorf("the caller's queue changed (-want +got):\n%s", diff)
			}
		})
	}
}

func TestAppendWaiter(t *testing.T) {
	var s locksv1.DistributedLockStatus
	for n := 1; n <= 3; n++ {
		s.AppendWaiter(waiter("bob", n))
		if int(s.WaiterCount) != n || s.WaiterIndex(fmt.Sprintf("req-%d", n)) != n-1 {
			t.Fatalf("after %d appends: waiterCount %d, index of req-%d %d", n, s.WaiterCount, n, s.WaiterIndex(fmt.Sprintf("req-%d", n)))
		}
	}
}

func TestWaiterModeOrDefault(t *testing.T) {
	for mode, want := range map[locksv1.Mode]locksv1.Mode{"": locksv1.Exclusive, locksv1.Exclusive: locksv1.Exclusive, locksv1.Shared: locksv1.Shared} {
		w := locksv1.Waiter{Mode: mode}
		if got := w.ModeOrDefault(); got != want {
			t.Errorf("mode %q: ModeOrDefault = %q, want %q", mode, got, want)
		}
	}
}

func TestAcquire(t *testing.T) {
	l := &locksv1.DistributedLock{}
	l.Status.AppendWaiter(waiter("bob", 1))
	l.Status.AppendWaiter(waiter("carol", 2))
	h := holder("bob", 1)
	l.Acquire(h, 42)
	if diff := cmp.Diff(&h, l.Status.Holder); diff != "" {
		t.Errorf("holder (-want +got):\n%s", diff)
	}
	if l.Status.FencingToken != 42 || l.Status.Transitions != 1 {
		t.Errorf("token, transitions = %d, %d; want 42, 1", l.Status.FencingToken, l.Status.Transitions)
	}
	if l.Status.WaiterCount != 1 || l.Status.WaiterIndex("req-2") != 0 {
		t.Errorf("queue = %+v, want only req-2", l.Status.Waiters)
	}
	if !l.IsHeld() || l.Status.Conditions[0].Status != metav1.ConditionTrue {
		t.Errorf("conditions = %+v, want Held=True", l.Status.Conditions)
	}
}

// TestHeldIsTheOnlyCondition: a transition leaves exactly the one Held
// condition admission lets lock users write, its message fixed per reason:
// nothing of the holder or the token.
func TestHeldIsTheOnlyCondition(t *testing.T) {
	l := &locksv1.DistributedLock{}
	l.Generation = 3
	l.Status.Conditions = []metav1.Condition{{Type: "Frozen", Status: metav1.ConditionTrue, Reason: "Attack"}}
	h := locksv1.LockHolder{Identity: strings.Repeat("é", 253), User: "alice", LeaseID: "lease-0000000000000001", RequestID: "r1"}
	l.Acquire(h, 7)
	if len(l.Status.Conditions) != 1 || l.Status.Conditions[0].Type != locksv1.ConditionHeld || l.Status.Conditions[0].Status != metav1.ConditionTrue {
		t.Fatalf("conditions after Acquire = %+v, want exactly Held=True", l.Status.Conditions)
	}
	c := l.Status.Conditions[0]
	if c.Message != "held" {
		t.Errorf("message after Acquire = %q, want the fixed %q", c.Message, "held")
	}
	if c.ObservedGeneration != 3 || l.Status.ObservedGeneration != 3 {
		t.Errorf("observedGeneration = %d/%d, want 3", c.ObservedGeneration, l.Status.ObservedGeneration)
	}
	l.EndHolding(locksv1.EndReasonReleased, "alice", metav1.NewMicroTime(time.Now()))
	if len(l.Status.Conditions) != 1 || l.Status.Conditions[0].Status != metav1.ConditionFalse || l.Status.Conditions[0].Reason != locksv1.ReasonReleased {
		t.Fatalf("conditions after EndHolding = %+v, want exactly Held=False Released", l.Status.Conditions)
	}
	if got := l.Status.Conditions[0].Message; got != "released" {
		t.Errorf("message after EndHolding = %q, want the fixed %q", got, "released")
	}
	// Another holder with another token writes the very same condition.
	l.Acquire(locksv1.LockHolder{Identity: "bob", User: "bob", LeaseID: "lease-0000000000000002", RequestID: "r2"}, 9)
	if diff := cmp.Diff(c, l.Status.Conditions[0], cmpopts.IgnoreFields(metav1.Condition{}, "LastTransitionTime")); diff != "" {
		t.Errorf("Held of a second acquisition differs from the first (-first +second):\n%s", diff)
	}
}

// TestHeldMessageIsFixedAndAdmissible: every reason a Held condition can have
// has its own short message, within what admission lets lock users write.
func TestHeldMessageIsFixedAndAdmissible(t *testing.T) {
	for _, reason := range []string{locksv1.ReasonAcquired, locksv1.ReasonReleased, locksv1.ReasonExpired, locksv1.ReasonForceReleased,
		string(locksv1.EndReasonSessionExpired), string(locksv1.EndReasonSessionClosed), locksv1.ReasonNeverHeld} {
		m := locksv1.HeldMessage(reason)
		if m == "" || utf8.RuneCountInString(m) > locksv1.MaxConditionMessage {
			t.Errorf("HeldMessage(%q) = %q, want a fixed text of at most %d characters", reason, m, locksv1.MaxConditionMessage)
		}
	}
}
