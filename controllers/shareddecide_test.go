package controllers

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

func rwMutex(l *locksv1alpha1.DistributedLock) { l.Spec.Type = locksv1alpha1.RWMutex }

func semaphore(permits int32) lockOpt {
	return func(l *locksv1alpha1.DistributedLock) {
		l.Spec.Type, l.Spec.Permits = locksv1alpha1.Semaphore, ptr.To(permits)
	}
}

// sharing adds the shared holding leaseID on slot with token, whose last
// renewal carries renewTime renew (client clock), as AcquireShared does.
func sharing(leaseID string, slot int32, token int64, leaseSeconds int32, renew time.Time) lockOpt {
	return func(l *locksv1alpha1.DistributedLock) {
		rt := metav1.NewMicroTime(renew)
		l.Status.SharedHolders = append(l.Status.SharedHolders, locksv1alpha1.SharedHolder{
			LockHolder: locksv1alpha1.LockHolder{
				Identity: "worker-" + leaseID, User: owner, LeaseID: leaseID, RequestID: "req-" + leaseID,
				LeaseDurationSeconds: leaseSeconds, AcquireTime: metav1.NewMicroTime(clientTime), RenewTime: &rt,
			},
			FencingToken: token, Slot: slot,
		})
		l.Status.FencingToken = max(l.Status.FencingToken, token)
		l.Status.Transitions++
		l.Status.HolderCount++
	}
}

// sharedIn puts the shared holding leaseID in session name.
func sharedIn(leaseID, name string) lockOpt {
	return func(l *locksv1alpha1.DistributedLock) {
		l.Status.SharedHolders[l.Status.SharedIndex(leaseID)].Session = name
	}
}

// sharedOfPod binds the shared holding leaseID to a pod.
func sharedOfPod(leaseID, podName, podUID string) lockOpt {
	return func(l *locksv1alpha1.DistributedLock) {
		h := &l.Status.SharedHolders[l.Status.SharedIndex(leaseID)]
		h.PodName, h.PodUID = podName, podUID
	}
}

// waitingFor queues a waiter for mode whose client-side wait lasts wait.
func waitingFor(requestID string, mode locksv1alpha1.Mode, wait time.Duration) lockOpt {
	return func(l *locksv1alpha1.DistributedLock) {
		waiting(requestID, wait)(l)
		l.Status.Waiters[len(l.Status.Waiters)-1].Mode = mode
	}
}

// decideAfter observes history on a fake clock and decides at at (offsets from t0).
func decideAfter(history []observed, at time.Duration, live liveness) decision {
	var obs *observation
	for _, h := range history {
		o, _ := observe(obs, h.lock, t0.Add(h.at))
		obs = &o
	}
	return decide(history[len(history)-1].lock, *obs, live, t0.Add(at), testTiming)
}

// expiredShared is the ending of shared holding leaseID whose lease of leaseSeconds saw no renewal.
func expiredShared(leaseID string, slot int32, token int64, leaseSeconds int32) ending {
	return endOf(leaseID, token, ptr.To(slot), ending{reason: locksv1alpha1.EndReasonExpired,
		why: fmt.Sprintf("no renewal observed for %ds + %s grace", leaseSeconds, testTiming.grace)})
}

func handoffDrop(requestID string) droppedWaiter {
	return droppedWaiter{requestID: requestID, identity: "w-" + requestID, reason: dropHandoffTimeout}
}

// TestDecideShared: every holding, exclusive or shared, is observed and ended
// on its own, on the controller's clock only.
func TestDecideShared(t *testing.T) {
	readers := func(opts ...lockOpt) *locksv1alpha1.DistributedLock {
		return newLock(append([]lockOpt{rwMutex, sharing("r1", 0, 50, 10, clientTime), sharing("r2", 1, 51, 10, clientTime)}, opts...)...)
	}
	// A writer queued behind a reader that is gone at 20 s.
	readersGoneAt20s := []observed{
		{0, newLock(rwMutex, sharing("r1", 0, 50, 300, clientTime), waitingFor("q1", locksv1alpha1.Exclusive, time.Hour))},
		{20 * time.Second, newLock(withRV("101"), rwMutex, withToken(50), waitingFor("q1", locksv1alpha1.Exclusive, time.Hour))},
	}
	var fullSemaphore []lockOpt
	for i := range int32(10) {
		fullSemaphore = append(fullSemaphore, sharing(fmt.Sprintf("s%d", i), i, 60+int64(i), 5, clientTime))
	}
	tests := []decideCase{
		{
			name:    "readers within their leases: requeued at the earliest expiry",
			history: []observed{{0, newLock(rwMutex, sharing("r1", 0, 50, 10, clientTime), sharing("r2", 1, 51, 30, clientTime))}},
			at:      5 * time.Second,
			want:    decision{requeueAfter: 7 * time.Second},
		},
		{
			name:    "a lapsed reader is expired; a reader with a longer lease keeps its holding",
			history: []observed{{0, newLock(rwMutex, sharing("r1", 0, 50, 10, clientTime), sharing("r2", 1, 51, 30, clientTime))}},
			at:      12 * time.Second,
			want:    decision{ends: []ending{expiredShared("r1", 0, 50, 10)}},
		},
		{
			name: "a renewal of one reader moves no other reader's lease",
			history: []observed{
				{0, readers()},
				{8 * time.Second, newLock(withRV("101"), rwMutex, sharing("r1", 0, 50, 10, clientTime), sharing("r2", 1, 51, 10, clientTime.Add(time.Second)))},
			},
			at:   12 * time.Second,
			want: decision{ends: []ending{expiredShared("r1", 0, 50, 10)}},
		},
		{
			name: "the renewed reader is requeued at its own expiry once the other has gone",
			history: []observed{
				{0, readers()},
				{8 * time.Second, newLock(withRV("101"), rwMutex, sharing("r2", 1, 51, 10, clientTime.Add(time.Second)))},
			},
			at:   12 * time.Second,
			want: decision{requeueAfter: 8 * time.Second},
		},
		{
			name:    "both readers lapsed: both end in one write",
			history: []observed{{0, readers()}},
			at:      12 * time.Second,
			want:    decision{ends: []ending{expiredShared("r1", 0, 50, 10), expiredShared("r2", 1, 51, 10)}},
		},
		{
			name:    "after a restart every reader counts as renewed when first seen",
			history: []observed{{time.Hour, readers()}},
			at:      time.Hour + 11*time.Second,
			want:    decision{requeueAfter: time.Second},
		},
		{
			name:    "an RWMutex's writer expires as a Mutex holder does; readers queued behind it stay",
			history: []observed{{0, newLock(rwMutex, held("a", 30, clientTime), waitingFor("q1", locksv1alpha1.Shared, time.Hour), waitingFor("q2", locksv1alpha1.Shared, time.Hour))}},
			at:      32 * time.Second,
			want:    decision{ends: []ending{expiredAfter(30)}},
		},
		{
			name:    "ten lapsed permits: the first eight end in this write, the rest in the next",
			history: []observed{{0, newLock(append([]lockOpt{semaphore(10)}, fullSemaphore...)...)}},
			at:      7 * time.Second,
			want: decision{ends: func() []ending {
				var es []ending
				for i := range int32(8) {
					es = append(es, expiredShared(fmt.Sprintf("s%d", i), i, 60+int64(i), 5))
				}
				return es
			}()},
		},
		{
			name: "a permit in a live session is not lease-expired; one whose session is gone ends SessionClosed; one without a session expires",
			history: []observed{{0, newLock(semaphore(3),
				sharing("s0", 0, 60, 5, clientTime), sharedIn("s0", "worker-s1"),
				sharing("s1", 1, 61, 5, clientTime), sharedIn("s1", "gone"),
				sharing("s2", 2, 62, 5, clientTime))}},
			at: 8 * time.Second,
			live: liveness{sessions: map[string]sessionState{
				"worker-s1": {name: "worker-s1", session: newSession(), seen: sessionObservation{uid: "session-uid-1", renewSeen: t0}},
				"gone":      {name: "gone"},
			}},
			want: decision{ends: []ending{
				endOf("s1", 61, ptr.To[int32](1), ending{reason: locksv1alpha1.EndReasonSessionClosed, why: "session gone does not exist in namespace shop"}),
				expiredShared("s2", 2, 62, 5),
			}},
		},
		{
			name:    "readers in a lapsed session end SessionExpired, each recorded",
			history: []observed{{0, readers(sharedIn("r1", "worker-s1"), sharedIn("r2", "worker-s1"))}},
			at:      12 * time.Second,
			live: liveness{sessions: map[string]sessionState{
				"worker-s1": {name: "worker-s1", session: newSession(), seen: sessionObservation{uid: "session-uid-1", renewSeen: t0}},
			}},
			want: decision{ends: []ending{
				endOf("r1", 50, ptr.To[int32](0), ending{reason: locksv1alpha1.EndReasonSessionExpired, why: "no renewal of session worker-s1 observed for its TTL 10s + 2s grace"}),
				endOf("r2", 51, ptr.To[int32](1), ending{reason: locksv1alpha1.EndReasonSessionExpired, why: "no renewal of session worker-s1 observed for its TTL 10s + 2s grace"}),
			}},
		},
		{
			name:    "a reader whose pod is gone ends; a reader of another pod stays",
			history: []observed{{0, readers(sharedOfPod("r1", "worker-0", podUID1), sharedOfPod("r2", "worker-1", podUID2))}},
			at:      time.Second,
			live:    liveness{podsGone: map[podRef]bool{podIn("worker-0", podUID1): true, podIn("worker-1", podUID2): false}},
			want:    decision{ends: []ending{endOf("r1", 50, ptr.To[int32](0), ending{reason: locksv1alpha1.EndReasonExpired, why: "holder pod worker-0 deleted"})}},
		},

		// Hand-off across modes.
		{
			name:    "a shared head is admitted while readers hold: dropped when it does not claim in time",
			history: []observed{{0, newLock(rwMutex, sharing("r1", 0, 50, 300, clientTime), waitingFor("q1", locksv1alpha1.Shared, time.Hour))}},
			at:      10 * time.Second,
			want:    decision{drop: []droppedWaiter{handoffDrop("q1")}},
		},
		{
			name:    "an exclusive head is not admitted while readers hold: kept, requeued at the nearest reader expiry",
			history: []observed{{0, newLock(rwMutex, sharing("r1", 0, 50, 300, clientTime), waitingFor("q1", locksv1alpha1.Exclusive, time.Hour))}},
			at:      time.Minute,
			want:    decision{requeueAfter: 242 * time.Second},
		},
		{
			name:    "an exclusive head's hand-off time starts when the last reader is gone",
			history: readersGoneAt20s,
			at:      25 * time.Second,
			want:    decision{requeueAfter: 5 * time.Second},
		},
		{
			name:    "and it is dropped handoffTimeoutSeconds after that",
			history: readersGoneAt20s,
			at:      30 * time.Second,
			want:    decision{drop: []droppedWaiter{handoffDrop("q1")}},
		},
		{
			name: "a full semaphore does not admit its head; the head's time starts when a permit frees",
			history: []observed{
				{0, newLock(semaphore(1), sharing("s0", 0, 60, 300, clientTime), waitingFor("q1", locksv1alpha1.Shared, time.Hour))},
				{20 * time.Second, newLock(withRV("101"), semaphore(1), withToken(60), waitingFor("q1", locksv1alpha1.Shared, time.Hour))},
			},
			at:   25 * time.Second,
			want: decision{requeueAfter: 5 * time.Second},
		},
		{
			name: "consecutive shared heads each get their own hand-off time",
			history: []observed{
				{0, newLock(rwMutex, withToken(49), waitingFor("q1", locksv1alpha1.Shared, time.Hour), waitingFor("q2", locksv1alpha1.Shared, time.Hour))},
				{5 * time.Second, newLock(withRV("101"), rwMutex, sharing("q1", 0, 50, 30, clientTime), waitingFor("q2", locksv1alpha1.Shared, time.Hour))},
			},
			at:   12 * time.Second,
			want: decision{requeueAfter: 3 * time.Second},
		},
		{
			name: "an exclusive head holds back the shared waiters behind it, and only it is timed",
			history: []observed{
				{0, newLock(rwMutex, withToken(49), waitingFor("q1", locksv1alpha1.Exclusive, time.Hour), waitingFor("q2", locksv1alpha1.Shared, time.Hour))},
			},
			at:   10 * time.Second,
			want: decision{drop: []droppedWaiter{handoffDrop("q1")}},
		},
		{
			name:    "a semaphore's waiter written without a mode waits shared",
			history: []observed{{0, newLock(semaphore(2), sharing("s0", 0, 60, 300, clientTime), waiting("q1", time.Hour))}},
			at:      10 * time.Second,
			want:    decision{drop: []droppedWaiter{handoffDrop("q1")}},
		},
	}
	runDecideCases(t, tests)
}

// decideCase is decide after history, at an offset from t0, with live.
type decideCase struct {
	name    string
	history []observed
	at      time.Duration
	live    liveness
	want    decision
}

func runDecideCases(t *testing.T, tests []decideCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := decideAfter(tt.history, tt.at, tt.live)
			if diff := cmp.Diff(tt.want, got, cmpDecision); diff != "" {
				t.Errorf("decide() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestDesiredStatusShared: an ended shared holding is recorded with its slot
// and token; Held stays True while any holding remains.
func TestDesiredStatusShared(t *testing.T) {
	const controller = "system:serviceaccount:kubelock-system:kubelock-manager"
	now := t0.Add(time.Minute)
	record := func(leaseID string, token int64, slot int32, reason locksv1alpha1.EndReason) locksv1alpha1.FinishedHolding {
		return locksv1alpha1.FinishedHolding{RequestID: "req-" + leaseID, LeaseID: leaseID, FencingToken: token, Identity: "worker-" + leaseID,
			EndTime: metav1.NewMicroTime(now), EndReason: reason, EndedBy: controller, Slot: ptr.To(slot)}
	}
	t.Run("one reader of two", func(t *testing.T) {
		l := newLock(rwMutex, sharing("r1", 0, 50, 10, clientTime), sharing("r2", 3, 51, 10, clientTime))
		got := desiredStatus(l, decision{ends: []ending{expiredShared("r1", 0, 50, 10)}}, controller, now).Status
		if diff := cmp.Diff([]string{"r2"}, leaseIDs(got.SharedHolders)); diff != "" {
			t.Errorf("shared holders (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]locksv1alpha1.FinishedHolding{record("r1", 50, 0, locksv1alpha1.EndReasonExpired)}, got.RecentAcquisitions); diff != "" {
			t.Errorf("recentAcquisitions (-want +got):\n%s", diff)
		}
		if got.HolderCount != 1 || got.FencingToken != 51 || got.Transitions != 2 {
			t.Errorf("holderCount %d, fencingToken %d, transitions %d; want 1, 51 (unchanged), 2 (unchanged)", got.HolderCount, got.FencingToken, got.Transitions)
		}
		if c := got.Conditions; len(c) != 1 || c[0].Status != metav1.ConditionTrue {
			t.Errorf("conditions = %+v, want Held=True while a reader holds", c)
		}
	})
	t.Run("the last reader", func(t *testing.T) {
		l := newLock(rwMutex, sharing("r2", 3, 51, 10, clientTime))
		got := desiredStatus(l, decision{ends: []ending{expiredShared("r2", 3, 51, 10)}}, controller, now).Status
		if len(got.SharedHolders) != 0 || got.HolderCount != 0 {
			t.Errorf("sharedHolders %v, holderCount %d; want none", got.SharedHolders, got.HolderCount)
		}
		if c := got.Conditions; len(c) != 1 || c[0].Status != metav1.ConditionFalse || c[0].Reason != locksv1alpha1.ReasonExpired {
			t.Errorf("conditions = %+v, want Held=False, Expired", c)
		}
	})
	t.Run("eight ended in one write are the eight records kept", func(t *testing.T) {
		opts := []lockOpt{semaphore(10)}
		var ends []ending
		var want []locksv1alpha1.FinishedHolding
		for i := range int32(10) {
			opts = append(opts, sharing(fmt.Sprintf("s%d", i), i, 60+int64(i), 5, clientTime))
			if i < 8 {
				ends = append(ends, expiredShared(fmt.Sprintf("s%d", i), i, 60+int64(i), 5))
				want = append(want, record(fmt.Sprintf("s%d", i), 60+int64(i), i, locksv1alpha1.EndReasonExpired))
			}
		}
		l := newLock(opts...)
		l.Status.RecentAcquisitions = []locksv1alpha1.FinishedHolding{record("old", 1, 0, locksv1alpha1.EndReasonReleased)}
		got := desiredStatus(l, decision{ends: ends}, controller, now).Status
		if diff := cmp.Diff(want, got.RecentAcquisitions); diff != "" {
			t.Errorf("recentAcquisitions (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]string{"s8", "s9"}, leaseIDs(got.SharedHolders)); diff != "" {
			t.Errorf("shared holders (-want +got):\n%s", diff)
		}
	})
	t.Run("a missing Held condition of a lock held shared is set True", func(t *testing.T) {
		l := newLock(semaphore(2), sharing("s0", 0, 60, 5, clientTime))
		c := heldCondition(l)
		if c == nil || c.Status != metav1.ConditionTrue || c.Message != "held" {
			t.Errorf("heldCondition() = %+v, want True, \"held\"", c)
		}
	})
}

func leaseIDs(hs []locksv1alpha1.SharedHolder) []string {
	var ids []string
	for _, h := range hs {
		ids = append(ids, h.LeaseID)
	}
	return ids
}

// TestObserveSharedTransitions: each shared holding is reported on its own,
// with its slot.
func TestObserveSharedTransitions(t *testing.T) {
	released := func(leaseID string, token int64, slot int32) lockOpt {
		return func(l *locksv1alpha1.DistributedLock) {
			l.Status.RecentAcquisitions = append(l.Status.RecentAcquisitions, locksv1alpha1.FinishedHolding{
				RequestID: "req-" + leaseID, LeaseID: leaseID, FencingToken: token, Identity: "worker-" + leaseID,
				EndTime: metav1.NewMicroTime(clientTime), EndReason: locksv1alpha1.EndReasonReleased, EndedBy: owner, Slot: ptr.To(slot),
			})
			l.Status.FencingToken = max(l.Status.FencingToken, token)
		}
	}
	slot := ptr.To[int32]
	tests := []struct {
		name       string
		prev, next *locksv1alpha1.DistributedLock
		want       []transition
	}{
		{
			name: "a second reader acquires",
			prev: newLock(rwMutex, sharing("r1", 0, 50, 30, clientTime)),
			next: newLock(rwMutex, sharing("r1", 0, 50, 30, clientTime), sharing("r2", 1, 51, 30, clientTime)),
			want: []transition{{kind: transitionAcquired, leaseID: "r2", identity: "worker-r2", token: 51, slot: slot(1)}},
		},
		{
			name: "one reader releases, the other stays",
			prev: newLock(rwMutex, sharing("r1", 0, 50, 30, clientTime), sharing("r2", 1, 51, 30, clientTime)),
			next: newLock(rwMutex, sharing("r2", 1, 51, 30, clientTime), released("r1", 50, 0)),
			want: []transition{{kind: transitionEnded, leaseID: "r1", identity: "worker-r1", token: 50, slot: slot(0), reason: locksv1alpha1.EndReasonReleased, endedBy: owner}},
		},
		{
			name: "a permit taken and returned between two observations is reported from recentAcquisitions",
			prev: newLock(semaphore(3), sharing("s0", 0, 60, 30, clientTime)),
			next: newLock(semaphore(3), sharing("s0", 0, 60, 30, clientTime), released("s1", 61, 1)),
			want: []transition{
				{kind: transitionAcquired, leaseID: "s1", identity: "worker-s1", token: 61, slot: slot(1)},
				{kind: transitionEnded, leaseID: "s1", identity: "worker-s1", token: 61, slot: slot(1), reason: locksv1alpha1.EndReasonReleased, endedBy: owner},
			},
		},
		{
			name: "the readers end and the writer queued behind them acquires, with its wait and hand-off",
			prev: newLock(rwMutex, sharing("r1", 0, 50, 30, clientTime), sharing("r2", 1, 51, 30, clientTime), waitingFor("req-a", locksv1alpha1.Exclusive, time.Hour)),
			next: newLock(rwMutex, released("r1", 50, 0), released("r2", 51, 1), held("a", 30, clientTime), withToken(60)),
			want: []transition{
				{kind: transitionEnded, leaseID: "r1", identity: "worker-r1", token: 50, slot: slot(0), reason: locksv1alpha1.EndReasonReleased, endedBy: owner},
				{kind: transitionEnded, leaseID: "r2", identity: "worker-r2", token: 51, slot: slot(1), reason: locksv1alpha1.EndReasonReleased, endedBy: owner},
				// Not admitted while the readers held: no hand-off time was observed.
				{kind: transitionAcquired, leaseID: "a", identity: "worker-a", token: 60, waited: time.Second},
			},
		},
		{
			name: "a shared head admitted at once reports its hand-off",
			prev: newLock(semaphore(2), sharing("s0", 0, 60, 30, clientTime), waitingFor("req-s1", locksv1alpha1.Shared, time.Hour)),
			next: newLock(semaphore(2), sharing("s0", 0, 60, 30, clientTime), sharing("s1", 1, 61, 30, clientTime)),
			want: []transition{{kind: transitionAcquired, leaseID: "s1", identity: "worker-s1", token: 61, slot: slot(1), waited: time.Second, handoff: time.Second}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prev, _ := observe(nil, tt.prev, t0)
			_, got := observe(&prev, tt.next, t0.Add(time.Second))
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(transition{}), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("observe() transitions mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSessionRefsCountSharedHoldings: the field indexes and status.locks see
// every holding in a session, shared ones included.
func TestSessionRefsCountSharedHoldings(t *testing.T) {
	l := newLock(semaphore(4),
		sharing("s0", 0, 60, 10, clientTime), sharedIn("s0", "worker-s1"), sharedOfPod("s0", "worker-0", "pod-uid-1"),
		sharing("s1", 1, 61, 10, clientTime), sharedIn("s1", "worker-s1"),
		sharing("s2", 2, 62, 10, clientTime), sharedIn("s2", "other"),
		waitingFor("q1", locksv1alpha1.Shared, time.Hour), func(l *locksv1alpha1.DistributedLock) { l.Status.Waiters[0].Session = "third" })
	want := map[string]sessionRef{"worker-s1": {holdings: 2}, "other": {holdings: 1}, "third": {waits: true}}
	if diff := cmp.Diff(want, sessionRefs(&cachedLock{DistributedLock: *l}), cmp.AllowUnexported(sessionRef{})); diff != "" {
		t.Errorf("sessionRefs() mismatch (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"pod-uid-1", "", ""}, holdingFields(l, func(h *locksv1alpha1.LockHolder) string { return h.PodUID })); diff != "" {
		t.Errorf("holdingFields(podUID) (-want +got):\n%s", diff)
	}
}
