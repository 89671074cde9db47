package controllers

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

const owner = "system:serviceaccount:shop:worker"

// Pod UIDs of the tables, canonical UUIDs as the apiserver gives them.
const (
	podUID1 = "6f3c9a1e-2b4d-4e8f-9a0b-1c2d3e4f5a6b"
	podUID2 = "0d9e8f7a-6b5c-4d3e-8f1a-2b3c4d5e6f7a"
)

// podIn is the pod name of UID uid in namespace shop, owner's.
func podIn(name, uid string) podRef {
	return podRef{key: types.NamespacedName{Namespace: "shop", Name: name}, uid: uid}
}

func newSession(opts ...func(*locksv1alpha1.LockSession)) *locksv1alpha1.LockSession {
	s := &locksv1alpha1.LockSession{
		ObjectMeta: metav1.ObjectMeta{Name: "worker-s1", Namespace: "shop", UID: "session-uid-1"},
		Spec:       locksv1alpha1.LockSessionSpec{User: owner, Identity: "worker", TTLSeconds: 10},
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

func renewedAt(t time.Time) func(*locksv1alpha1.LockSession) {
	return func(s *locksv1alpha1.LockSession) { s.Status.RenewTime = ptr.To(metav1.NewMicroTime(t)) }
}

// inSession makes the holder hold in session name.
func inSession(name string) lockOpt {
	return func(l *locksv1alpha1.DistributedLock) { l.Status.Holder.Session = name }
}

func TestObserveSession(t *testing.T) {
	s := newSession()
	first := observeSession(nil, s, t0)
	if !first.renewSeen.Equal(t0) {
		t.Errorf("a new session counts as renewed when first seen, got %v", first.renewSeen)
	}
	if got := observeSession(&first, newSession(func(s *locksv1alpha1.LockSession) { s.Status.Locks = 3 }), t0.Add(5*time.Second)); !got.renewSeen.Equal(t0) {
		t.Errorf("a write that is not a renewal moved renewSeen to %v", got.renewSeen)
	}
	// Client clocks never decide: a renewTime years in the past is a renewal now.
	renewed := observeSession(&first, newSession(renewedAt(clientTime)), t0.Add(8*time.Second))
	if !renewed.renewSeen.Equal(t0.Add(8 * time.Second)) {
		t.Errorf("a renewal is seen when observed, got %v", renewed.renewSeen)
	}
	other := newSession(renewedAt(clientTime))
	other.UID = "session-uid-2"
	if got := observeSession(&renewed, other, t0.Add(9*time.Second)); !got.renewSeen.Equal(t0.Add(9 * time.Second)) {
		t.Errorf("a new session of the same name starts afresh, got %v", got.renewSeen)
	}
}

func TestDecideSession(t *testing.T) {
	grace := testTiming.grace
	seen := sessionObservation{uid: "session-uid-1", renewSeen: t0}
	tests := []struct {
		name           string
		session        *locksv1alpha1.LockSession
		holdings, refs int
		at             time.Duration
		want           sessionDecision
	}{
		{name: "alive, count right: requeue at TTL+grace", session: newSession(), at: 4 * time.Second,
			want: sessionDecision{requeueAfter: 8 * time.Second}},
		{name: "alive, count changed: write it", session: newSession(), holdings: 3, refs: 4, at: time.Second,
			want: sessionDecision{locks: ptr.To[int32](3), requeueAfter: 11 * time.Second}},
		{name: "one microsecond before TTL+grace it lives", session: newSession(), holdings: 1, refs: 1, at: 12*time.Second - time.Microsecond,
			want: sessionDecision{locks: ptr.To[int32](1), requeueAfter: time.Microsecond}},
		{name: "lapsed with locks: they go first", session: newSession(), holdings: 2, refs: 2, at: 12 * time.Second,
			want: sessionDecision{lapsed: true, requeueAfter: 10 * time.Second}},
		{name: "lapsed with only a waiter: it goes first", session: newSession(), refs: 1, at: time.Minute,
			want: sessionDecision{lapsed: true, requeueAfter: 10 * time.Second}},
		{name: "lapsed and nothing names it: delete", session: newSession(), at: 12 * time.Second,
			want: sessionDecision{lapsed: true, delete: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := decideSession(tt.session, seen, tt.holdings, tt.refs, t0.Add(tt.at), grace)
			if diff := cmp.Diff(tt.want, got, cmpDecision); diff != "" {
				t.Errorf("decideSession() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecideWithSessions(t *testing.T) {
	alive := func(s *locksv1alpha1.LockSession) map[string]sessionState {
		return map[string]sessionState{s.Name: {name: s.Name, session: s, seen: sessionObservation{uid: s.UID, renewSeen: t0}}}
	}
	closed := func(why string) []ending {
		return []ending{endOf("a", 42, nil, ending{reason: locksv1alpha1.EndReasonSessionClosed, why: why})}
	}
	podBound := newSession(func(s *locksv1alpha1.LockSession) { s.Spec.PodName, s.Spec.PodUID = "worker-0", "pod-uid-1" })
	terminating := newSession(func(s *locksv1alpha1.LockSession) { s.DeletionTimestamp = ptr.To(metav1.NewTime(clientTime)) })
	sessionWaiter := func(requestID, user, session string) lockOpt {
		return func(l *locksv1alpha1.DistributedLock) {
			l.Status.AppendWaiter(locksv1alpha1.Waiter{Identity: "w-" + requestID, User: user, RequestID: requestID, Session: session,
				EnqueueTime: metav1.NewMicroTime(clientTime), Deadline: metav1.NewMicroTime(clientTime.Add(time.Hour))})
		}
	}
	tests := []struct {
		name string
		lock *locksv1alpha1.DistributedLock
		live liveness
		at   time.Duration
		want decision
	}{
		{
			name: "a session holding is never lease-expired while its session lives",
			lock: newLock(held("a", 10, clientTime), inSession("worker-s1")),
			live: liveness{sessions: alive(newSession())},
			at:   11 * time.Second,
			want: decision{},
		},
		{
			name: "its session lapsed: SessionExpired",
			lock: newLock(held("a", 10, clientTime), inSession("worker-s1")),
			live: liveness{sessions: alive(newSession())},
			at:   12 * time.Second,
			want: decision{ends: []ending{endOf("a", 42, nil, ending{reason: locksv1alpha1.EndReasonSessionExpired, why: "no renewal of session worker-s1 observed for its TTL 10s + 2s grace"})}},
		},
		{
			name: "its session is missing: SessionClosed at once",
			lock: newLock(held("a", 10, clientTime), inSession("gone")),
			live: liveness{sessions: map[string]sessionState{"gone": {name: "gone"}}},
			want: decision{ends: closed("session gone does not exist in namespace shop")},
		},
		{
			name: "its session is terminating",
			lock: newLock(held("a", 10, clientTime), inSession("worker-s1")),
			live: liveness{sessions: alive(terminating)},
			want: decision{ends: closed("session worker-s1 is being deleted")},
		},
		{
			name: "its session is someone else's",
			lock: func() *locksv1alpha1.DistributedLock {
				l := newLock(held("a", 10, clientTime), inSession("worker-s1"))
				l.Status.Holder.User = "mallory"
				return l
			}(),
			live: liveness{sessions: alive(newSession())},
			want: decision{ends: closed(`session worker-s1 is not the holder's: it belongs to "` + owner + `", not "mallory"`)},
		},
		{
			name: "its session is bound to another pod",
			lock: func() *locksv1alpha1.DistributedLock {
				l := newLock(held("a", 10, clientTime), inSession("worker-s1"))
				l.Status.Holder.PodName, l.Status.Holder.PodUID = "worker-1", "pod-uid-2"
				return l
			}(),
			live: liveness{sessions: alive(podBound)},
			want: decision{ends: closed(`session worker-s1 is bound to pod worker-0 (UID pod-uid-1); a holding or waiter in it must carry that podUID, not "pod-uid-2"`)},
		},
		{
			// Red team: the policy engine cannot read the session, so a
			// holding with an in-bounds leaseDurationSeconds in a session of TTL
			// 3600 would otherwise hold a lock bounded to 300 s for an hour.
			name: "its session's TTL exceeds the lock's maxLeaseDurationSeconds: SessionClosed at once",
			lock: newLock(held("a", 10, clientTime), inSession("worker-s1")),
			live: liveness{sessions: alive(newSession(func(s *locksv1alpha1.LockSession) { s.Spec.TTLSeconds = 3600 }))},
			want: decision{ends: closed("session worker-s1 has ttlSeconds 3600, more than the lock's spec.maxLeaseDurationSeconds 300: a holding in it could outlive the lock's bound")},
		},
		{
			// Red team: a pod's holding in its account's pod-less session
			// (made by an unbound token, or recreated under a gone pod
			// session's name) would outlive the pod.
			name: "a pod's holding in a session bound to no pod",
			lock: func() *locksv1alpha1.DistributedLock {
				l := newLock(held("a", 10, clientTime), inSession("worker-s1"))
				l.Status.Holder.PodName, l.Status.Holder.PodUID = "worker-0", "pod-uid-1"
				return l
			}(),
			live: liveness{sessions: alive(newSession())},
			want: decision{ends: closed(`session worker-s1 is bound to no pod; a holding or waiter of pod UID "pod-uid-1" must be in a session of that pod`)},
		},
		{
			name: "a pod-bound holder without a session whose pod is gone: Expired",
			lock: func() *locksv1alpha1.DistributedLock {
				l := newLock(held("a", 30, clientTime))
				l.Status.Holder.PodName, l.Status.Holder.PodUID = "worker-0", podUID1
				return l
			}(),
			live: liveness{podsGone: map[podRef]bool{podIn("worker-0", podUID1): true}},
			want: decision{ends: []ending{endOf("a", 42, nil, ending{reason: locksv1alpha1.EndReasonExpired, why: "holder pod worker-0 deleted"})}},
		},
		{
			name: "waiters of a lapsed, missing or foreign session are dropped; others stay",
			lock: newLock(held("a", 30, clientTime),
				sessionWaiter("w1", owner, "worker-s1"), sessionWaiter("w2", "mallory", "worker-s1"),
				sessionWaiter("w3", owner, "gone"), sessionWaiter("w4", owner, "")),
			live: liveness{sessions: map[string]sessionState{"worker-s1": alive(newSession())["worker-s1"], "gone": {name: "gone"}}},
			at:   5 * time.Second,
			want: decision{drop: []droppedWaiter{
				{requestID: "w2", identity: "w-w2", reason: dropSessionClosed},
				{requestID: "w3", identity: "w-w3", reason: dropSessionClosed},
			}},
		},
		{
			name: "a pod-bound waiter without a session whose pod is gone is dropped; one whose pod lives stays",
			lock: func() *locksv1alpha1.DistributedLock {
				l := newLock(held("a", 30, clientTime), sessionWaiter("w1", owner, ""), sessionWaiter("w2", owner, ""))
				l.Status.Waiters[0].PodName, l.Status.Waiters[0].PodUID = "worker-0", podUID1
				l.Status.Waiters[1].PodName, l.Status.Waiters[1].PodUID = "worker-1", podUID2
				return l
			}(),
			live: liveness{podsGone: map[podRef]bool{podIn("worker-0", podUID1): true, podIn("worker-1", podUID2): false}},
			want: decision{drop: []droppedWaiter{{requestID: "w1", identity: "w-w1", reason: dropPodDeleted}}},
		},
		{
			name: "waiters of a lapsed session are dropped",
			lock: newLock(held("a", 30, clientTime), sessionWaiter("w1", owner, "worker-s1")),
			live: liveness{sessions: alive(newSession())},
			at:   20 * time.Second,
			want: decision{drop: []droppedWaiter{{requestID: "w1", identity: "w-w1", reason: dropSessionExpired}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obs, _ := observe(nil, tt.lock, t0)
			got := decide(tt.lock, obs, tt.live, t0.Add(tt.at), testTiming)
			if !tt.want.acts() {
				// Only the session decides: what remains is the requeue for the queue.
				got.requeueAfter = 0
			}
			if diff := cmp.Diff(tt.want, got, cmpDecision); diff != "" {
				t.Errorf("decide() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDesiredStatusEndsSessionHolding(t *testing.T) {
	l := newLock(held("a", 10, clientTime), inSession("worker-s1"))
	got := desiredStatus(l, decision{ends: []ending{{leaseID: "a", reason: locksv1alpha1.EndReasonSessionExpired}}}, "controller", t0)
	if got.Status.Holder != nil {
		t.Fatalf("holder = %+v, want none", got.Status.Holder)
	}
	last := got.Status.RecentAcquisitions[len(got.Status.RecentAcquisitions)-1]
	if last.EndReason != locksv1alpha1.EndReasonSessionExpired || last.EndedBy != "controller" || last.FencingToken != 42 {
		t.Errorf("recorded holding = %+v", last)
	}
}
