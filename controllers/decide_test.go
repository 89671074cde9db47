package controllers

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	testingclock "k8s.io/utils/clock/testing"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// t0 is the controller clock's start in every test; client timestamps are put
// far away from it on purpose, to show that they never decide anything.
var (
	t0         = time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	clientTime = time.Date(1999, 6, 1, 0, 0, 0, 0, time.UTC)
	testTiming = timing{grace: 2 * time.Second, idleTimeout: time.Hour}
)

type lockOpt func(*locksv1alpha1.DistributedLock)

func newLock(opts ...lockOpt) *locksv1alpha1.DistributedLock {
	l := &locksv1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "shop", UID: "uid-1", ResourceVersion: "100", Generation: 1},
		Spec:       locksv1alpha1.DistributedLockSpec{LeaseDurationSeconds: 30, MaxLeaseDurationSeconds: 300, HandoffTimeoutSeconds: 10},
	}
	for _, o := range opts {
		o(l)
	}
	return l
}

// held gives the lock a holder whose last renewal carries renewTime renew (client clock).
func held(leaseID string, leaseSeconds int32, renew time.Time) lockOpt {
	return func(l *locksv1alpha1.DistributedLock) {
		rt := metav1.NewMicroTime(renew)
		l.Status.Holder = &locksv1alpha1.LockHolder{
			Identity: "worker-" + leaseID, User: "system:serviceaccount:shop:worker", LeaseID: leaseID,
			RequestID: "req-" + leaseID, LeaseDurationSeconds: leaseSeconds,
			AcquireTime: metav1.NewMicroTime(clientTime), RenewTime: &rt,
		}
		l.Status.FencingToken = 42
		l.Status.Transitions = 1
		l.Status.HolderCount = 1
	}
}

// waiting queues a waiter whose client-side wait lasts wait.
func waiting(requestID string, wait time.Duration) lockOpt {
	return func(l *locksv1alpha1.DistributedLock) {
		l.Status.AppendWaiter(locksv1alpha1.Waiter{
			Identity: "w-" + requestID, User: "u", RequestID: requestID,
			EnqueueTime: metav1.NewMicroTime(clientTime), Deadline: metav1.NewMicroTime(clientTime.Add(wait)),
		})
	}
}

func autoCreated(l *locksv1alpha1.DistributedLock) {
	l.Labels = map[string]string{locksv1alpha1.AutoCreatedLabel: "true"}
}

func withRV(rv string) lockOpt {
	return func(l *locksv1alpha1.DistributedLock) { l.ResourceVersion = rv }
}

func withToken(token int64) lockOpt {
	return func(l *locksv1alpha1.DistributedLock) { l.Status.FencingToken = token }
}

// cmpDecision compares decisions; an ending's deadline (due) is checked by
// TestDecideKnowsTheExpiryDeadline.
var cmpDecision = cmp.Options{cmp.AllowUnexported(decision{}, droppedWaiter{}, ending{}, sessionDecision{}), cmpopts.IgnoreFields(ending{}, "due")}

// expiredAfter is the ending of holder "a" (token 42, see held) whose lease
// of leaseSeconds saw no renewal.
func expiredAfter(leaseSeconds int32) ending {
	return endOf("a", 42, nil, ending{reason: locksv1alpha1.EndReasonExpired,
		why: fmt.Sprintf("no renewal observed for %ds + %s grace", leaseSeconds, testTiming.grace)})
}

// endOf is e as the ending of the holding leaseID (identity "worker-"+leaseID) with token and slot.
func endOf(leaseID string, token int64, slot *int32, e ending) ending {
	e.leaseID, e.identity, e.token, e.slot = leaseID, "worker-"+leaseID, token, slot
	return e
}

// A lease expiry carries its deadline on the controller's clock, the last
// renewal it observed plus the lease and the grace, however late decide
// runs: kubelock_controller_expiry_delay_seconds measures from there.
func TestDecideKnowsTheExpiryDeadline(t *testing.T) {
	renewed := newLock(held("a", 30, clientTime))
	prev, _ := observe(nil, renewed, t0)
	again := newLock(held("a", 30, clientTime.Add(10*time.Second)))
	obs, _ := observe(&prev, again, t0.Add(5*time.Second))
	d := decide(again, obs, liveness{}, t0.Add(time.Minute), testTiming)
	if len(d.ends) != 1 {
		t.Fatalf("decide() = %+v, want one ending", d)
	}
	if want := t0.Add(5*time.Second + 30*time.Second + testTiming.grace); !d.ends[0].due.Equal(want) {
		t.Errorf("due = %s, want %s (the renewal seen at t0+5s, + lease + grace)", d.ends[0].due, want)
	}
}

func TestDecide(t *testing.T) {
	tests := []struct {
		name string
		// history is the sequence of lock states the controller observed, each
		// at the given offset from t0 on its own clock.
		history []observed
		// at is when decide runs, as an offset from t0.
		at   time.Duration
		want decision
	}{
		{
			name:    "fresh holding is not expired, requeued at lease+grace",
			history: []observed{{0, newLock(held("a", 30, clientTime))}},
			at:      10 * time.Second,
			want:    decision{requeueAfter: 22 * time.Second},
		},
		{
			name:    "no renewal observed for lease+grace expires",
			history: []observed{{0, newLock(held("a", 30, clientTime))}},
			at:      32 * time.Second,
			want:    decision{ends: []ending{expiredAfter(30)}},
		},
		{
			name:    "one microsecond before lease+grace is not expired",
			history: []observed{{0, newLock(held("a", 30, clientTime))}},
			at:      32*time.Second - time.Microsecond,
			want:    decision{requeueAfter: time.Microsecond},
		},
		{
			name: "an observed renewal restarts the lease",
			history: []observed{
				{0, newLock(held("a", 30, clientTime))},
				{20 * time.Second, newLock(withRV("101"), held("a", 30, clientTime.Add(time.Second)))},
			},
			at:   40 * time.Second,
			want: decision{requeueAfter: 12 * time.Second},
		},
		{
			name: "a write that is not a renewal does not extend the lease",
			history: []observed{
				{0, newLock(held("a", 30, clientTime))},
				{20 * time.Second, newLock(withRV("101"), held("a", 30, clientTime), waiting("w1", time.Hour))},
			},
			at:   32 * time.Second,
			want: decision{ends: []ending{expiredAfter(30)}},
		},
		{
			name: "a renewal whose timestamp went backwards still counts",
			history: []observed{
				{0, newLock(held("a", 5, clientTime))},
				{6 * time.Second, newLock(withRV("101"), held("a", 5, clientTime.Add(-time.Hour)))},
			},
			at:   8 * time.Second,
			want: decision{requeueAfter: 5 * time.Second},
		},
		{
			name: "after a restart an old renewTime is treated as renewed now",
			// The holder's renewTime is years old by any clock; only the
			// controller's first observation counts.
			history: []observed{{time.Hour, newLock(held("a", 3, clientTime))}},
			at:      time.Hour + 4*time.Second,
			want:    decision{requeueAfter: time.Second},
		},
		{
			name:    "waiter within its wait is kept; requeue at the nearest deadline",
			history: []observed{{0, newLock(held("a", 30, clientTime), waiting("w1", 20*time.Second), waiting("w2", 10*time.Second))}},
			at:      5 * time.Second,
			want:    decision{requeueAfter: 5 * time.Second},
		},
		{
			name: "waiter past first-seen + (deadline - enqueueTime) is dropped",
			history: []observed{
				{0, newLock(held("a", 30, clientTime), waiting("w1", 20*time.Second))},
				{3 * time.Second, newLock(withRV("101"), held("a", 30, clientTime), waiting("w1", 20*time.Second), waiting("w2", 20*time.Second))},
			},
			at:   20 * time.Second,
			want: decision{drop: []droppedWaiter{{requestID: "w1", identity: "w-w1", reason: dropWaitTimeout}}},
		},
		{
			name:    "waiter whose deadline is before its enqueue time is dropped at once",
			history: []observed{{0, newLock(held("a", 30, clientTime), waiting("w1", -time.Minute))}},
			at:      0,
			want:    decision{drop: []droppedWaiter{{requestID: "w1", identity: "w-w1", reason: dropWaitTimeout}}},
		},
		{
			name:    "head of a free lock within the hand-off timeout is kept",
			history: []observed{{0, newLock(withToken(42), waiting("w1", time.Hour), waiting("w2", time.Hour))}},
			at:      4 * time.Second,
			want:    decision{requeueAfter: 6 * time.Second},
		},
		{
			name:    "head of a free lock that did not claim it in time is dropped",
			history: []observed{{0, newLock(withToken(42), waiting("w1", time.Hour), waiting("w2", time.Hour))}},
			at:      10 * time.Second,
			want:    decision{drop: []droppedWaiter{{requestID: "w1", identity: "w-w1", reason: dropHandoffTimeout}}},
		},
		{
			name: "hand-off time starts when the lock is seen free, not when the waiter queued",
			history: []observed{
				{0, newLock(held("a", 30, clientTime), waiting("w1", time.Hour))},
				{20 * time.Second, newLock(withRV("101"), withToken(42), waiting("w1", time.Hour))},
			},
			at:   25 * time.Second,
			want: decision{requeueAfter: 5 * time.Second},
		},
		{
			name: "new head gets its own hand-off time",
			history: []observed{
				{0, newLock(withToken(42), waiting("w1", time.Hour), waiting("w2", time.Hour))},
				{10 * time.Second, newLock(withRV("101"), withToken(42), waiting("w2", time.Hour))},
			},
			at:   15 * time.Second,
			want: decision{requeueAfter: 5 * time.Second},
		},
		{
			name:    "a head dropped for its deadline is not dropped twice",
			history: []observed{{0, newLock(withToken(42), waiting("w1", 5*time.Second), waiting("w2", time.Hour))}},
			at:      10 * time.Second,
			want:    decision{drop: []droppedWaiter{{requestID: "w1", identity: "w-w1", reason: dropWaitTimeout}}},
		},
		{
			name:    "auto-created lock idle for less than the idle timeout is kept",
			history: []observed{{0, newLock(autoCreated, withToken(42))}},
			at:      time.Minute,
			want:    decision{requeueAfter: 59 * time.Minute},
		},
		{
			name:    "auto-created lock idle past the idle timeout is deleted",
			history: []observed{{0, newLock(autoCreated, withToken(42))}},
			at:      time.Hour,
			want:    decision{delete: true},
		},
		{
			name: "an acquisition between observations restarts idleness",
			history: []observed{
				{0, newLock(autoCreated, withToken(42))},
				{50 * time.Minute, newLock(autoCreated, withRV("200"), withToken(101))},
			},
			at:   time.Hour,
			want: decision{requeueAfter: 50 * time.Minute},
		},
		{
			name:    "an auto-created lock whose spec an administrator changed is never deleted",
			history: []observed{{0, newLock(autoCreated, withToken(42), func(l *locksv1alpha1.DistributedLock) { l.Generation = 2 })}},
			at:      48 * time.Hour,
			want:    decision{},
		},
		{
			name:    "a lock that was not auto-created is never deleted",
			history: []observed{{0, newLock(withToken(42))}},
			at:      48 * time.Hour,
			want:    decision{},
		},
		{
			name:    "held auto-created lock is not idle",
			history: []observed{{0, newLock(autoCreated, held("a", 30, clientTime))}},
			at:      2 * time.Hour,
			want:    decision{ends: []ending{expiredAfter(30)}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := testingclock.NewFakePassiveClock(t0)
			var obs *observation
			for _, h := range tt.history {
				clk.SetTime(t0.Add(h.at))
				o, _ := observe(obs, h.lock, clk.Now())
				obs = &o
			}
			clk.SetTime(t0.Add(tt.at))
			last := tt.history[len(tt.history)-1].lock
			got := decide(last, *obs, liveness{}, clk.Now(), testTiming)
			if diff := cmp.Diff(tt.want, got, cmpDecision); diff != "" {
				t.Errorf("decide() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

type observed struct {
	at   time.Duration
	lock *locksv1alpha1.DistributedLock
}

func TestObserveTransitions(t *testing.T) {
	released := func(leaseID string, reason locksv1alpha1.EndReason) lockOpt {
		return func(l *locksv1alpha1.DistributedLock) {
			l.Status.FencingToken = 42
			l.Status.Transitions = 1
			l.Status.RecentAcquisitions = []locksv1alpha1.FinishedHolding{{
				RequestID: "req-" + leaseID, LeaseID: leaseID, FencingToken: 42, Identity: "worker-" + leaseID,
				EndTime: metav1.NewMicroTime(clientTime), EndReason: reason, EndedBy: "someone",
			}}
		}
	}
	tests := []struct {
		name string
		prev *locksv1alpha1.DistributedLock
		next *locksv1alpha1.DistributedLock
		want []transition
	}{
		{
			name: "first observation reports nothing",
			next: newLock(held("a", 30, clientTime)),
		},
		{
			name: "renewal is no transition",
			prev: newLock(held("a", 30, clientTime)),
			next: newLock(held("a", 30, clientTime.Add(time.Second))),
		},
		{
			name: "free to held is an acquisition",
			prev: newLock(),
			next: newLock(held("a", 30, clientTime)),
			want: []transition{{kind: transitionAcquired, leaseID: "a", identity: "worker-a", token: 42}},
		},
		{
			name: "held to free reports the recorded end reason",
			prev: newLock(held("a", 30, clientTime)),
			next: newLock(released("a", locksv1alpha1.EndReasonReleased)),
			want: []transition{{kind: transitionEnded, leaseID: "a", identity: "worker-a", token: 42, reason: locksv1alpha1.EndReasonReleased, endedBy: "someone"}},
		},
		{
			name: "force-release is reported as such",
			prev: newLock(held("a", 30, clientTime)),
			next: newLock(released("a", locksv1alpha1.EndReasonForceReleased)),
			want: []transition{{kind: transitionEnded, leaseID: "a", identity: "worker-a", token: 42, reason: locksv1alpha1.EndReasonForceReleased, endedBy: "someone"}},
		},
		{
			name: "a missed release between two holders reports both",
			prev: newLock(held("a", 30, clientTime)),
			next: newLock(released("a", locksv1alpha1.EndReasonReleased), held("b", 30, clientTime), withToken(50)),
			want: []transition{
				{kind: transitionEnded, leaseID: "a", identity: "worker-a", token: 42, reason: locksv1alpha1.EndReasonReleased, endedBy: "someone"},
				{kind: transitionAcquired, leaseID: "b", identity: "worker-b", token: 50},
			},
		},
		{
			name: "the head's acquisition reports its wait and hand-off",
			prev: newLock(withToken(42), waiting("req-b", time.Hour)),
			next: newLock(held("b", 30, clientTime), withToken(50)),
			want: []transition{{kind: transitionAcquired, leaseID: "b", identity: "worker-b", token: 50, waited: time.Second, handoff: time.Second}},
		},
		{
			name: "a holding that began and ended between two observations is reported from recentAcquisitions",
			prev: newLock(released("a", locksv1alpha1.EndReasonReleased)),
			next: newLock(func(l *locksv1alpha1.DistributedLock) {
				l.Status.FencingToken = 60
				l.Status.Transitions = 3
				l.Status.RecentAcquisitions = []locksv1alpha1.FinishedHolding{
					{LeaseID: "a", FencingToken: 42, Identity: "worker-a", EndReason: locksv1alpha1.EndReasonReleased, EndedBy: "someone"},
					{LeaseID: "b", FencingToken: 50, Identity: "worker-b", EndReason: locksv1alpha1.EndReasonForceReleased, EndedBy: "operator"},
				}
			}, held("c", 30, clientTime), withToken(60)),
			want: []transition{
				{kind: transitionAcquired, leaseID: "b", identity: "worker-b", token: 50},
				{kind: transitionEnded, leaseID: "b", identity: "worker-b", token: 50, reason: locksv1alpha1.EndReasonForceReleased, endedBy: "operator"},
				{kind: transitionAcquired, leaseID: "c", identity: "worker-c", token: 60},
			},
		},
		{
			name: "a recreated object starts a fresh observation",
			prev: newLock(held("a", 30, clientTime)),
			next: newLock(func(l *locksv1alpha1.DistributedLock) { l.UID = "uid-2" }),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var prev *observation
			if tt.prev != nil {
				o, _ := observe(nil, tt.prev, t0)
				prev = &o
			}
			_, got := observe(prev, tt.next, t0.Add(time.Second))
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(transition{}), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("observe() transitions mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestIsStale(t *testing.T) {
	o, _ := observe(nil, newLock(withRV("200")), t0)
	for _, tt := range []struct {
		lock *locksv1alpha1.DistributedLock
		want bool
	}{
		{newLock(withRV("199")), true},
		{newLock(withRV("200")), false},
		{newLock(withRV("1000")), false},
		{newLock(withRV("5"), func(l *locksv1alpha1.DistributedLock) { l.UID = "uid-2" }), false},
	} {
		if got := isStale(&o, tt.lock); got != tt.want {
			t.Errorf("isStale(rv %s, uid %s) = %v, want %v", tt.lock.ResourceVersion, tt.lock.UID, got, tt.want)
		}
	}
}

func TestDesiredStatus(t *testing.T) {
	now := t0.Add(time.Minute)
	heldCond := func(status metav1.ConditionStatus, reason, msg string, gen int64) metav1.Condition {
		return metav1.Condition{Type: locksv1alpha1.ConditionHeld, Status: status, Reason: reason, Message: msg, ObservedGeneration: gen}
	}
	tests := []struct {
		name string
		lock *locksv1alpha1.DistributedLock
		d    decision
		want locksv1alpha1.DistributedLockStatus
	}{
		{
			name: "expiry records the holding and sets Held=False",
			lock: newLock(held("a", 30, clientTime), waiting("w1", time.Hour)),
			d:    decision{ends: []ending{expiredAfter(30)}},
			want: locksv1alpha1.DistributedLockStatus{
				FencingToken: 42, Transitions: 1, ObservedGeneration: 1,
				Waiters: newLock(waiting("w1", time.Hour)).Status.Waiters, WaiterCount: 1,
				RecentAcquisitions: []locksv1alpha1.FinishedHolding{{
					RequestID: "req-a", LeaseID: "a", FencingToken: 42, Identity: "worker-a",
					EndTime: metav1.NewMicroTime(now), EndReason: locksv1alpha1.EndReasonExpired, EndedBy: "system:serviceaccount:kubelock-system:kubelock-manager",
				}},
				Conditions: []metav1.Condition{heldCond(metav1.ConditionFalse, "Expired", "lease expired", 1)},
			},
		},
		{
			name: "dropping waiters keeps waiterCount in step",
			lock: newLock(withToken(7), waiting("w1", time.Hour), waiting("w2", time.Hour), waiting("w3", time.Hour)),
			d:    decision{drop: []droppedWaiter{{requestID: "w1"}, {requestID: "w3"}}},
			want: locksv1alpha1.DistributedLockStatus{
				FencingToken: 7, ObservedGeneration: 1,
				Waiters: newLock(waiting("w2", time.Hour)).Status.Waiters, WaiterCount: 1,
				Conditions: []metav1.Condition{heldCond(metav1.ConditionFalse, "NeverHeld", "never held", 1)},
			},
		},
		{
			name: "a missing Held condition on a held lock is set True",
			lock: newLock(held("a", 30, clientTime)),
			want: func() locksv1alpha1.DistributedLockStatus {
				s := newLock(held("a", 30, clientTime)).Status
				s.ObservedGeneration = 1
				s.Conditions = []metav1.Condition{heldCond(metav1.ConditionTrue, "Acquired", "held", 1)}
				return s
			}(),
		},
		{
			name: "foreign conditions go and the Held message names no holder, however long its identity",
			lock: func() *locksv1alpha1.DistributedLock {
				l := newLock(held("a", 30, clientTime))
				l.Status.Holder.Identity = strings.Repeat("w", 253)
				for _, typ := range []string{"Frozen", "Stuck"} {
					l.Status.Conditions = append(l.Status.Conditions, metav1.Condition{Type: typ, Status: metav1.ConditionTrue, Reason: "Attack"})
				}
				return l
			}(),
			want: func() locksv1alpha1.DistributedLockStatus {
				s := newLock(held("a", 30, clientTime)).Status
				s.Holder.Identity = strings.Repeat("w", 253)
				s.ObservedGeneration = 1
				s.Conditions = []metav1.Condition{heldCond(metav1.ConditionTrue, "Acquired", "held", 1)}
				return s
			}(),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := desiredStatus(tt.lock, tt.d, "system:serviceaccount:kubelock-system:kubelock-manager", now)
			if diff := cmp.Diff(tt.want, got.Status, cmpopts.IgnoreFields(metav1.Condition{}, "LastTransitionTime")); diff != "" {
				t.Errorf("desiredStatus() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestHeldConditionKeepsConsistentOne(t *testing.T) {
	l := newLock(held("a", 30, clientTime))
	l.Acquire(*l.Status.Holder, 42) // sets Held=True the way a client does
	if c := heldCondition(l); c != nil {
		t.Errorf("heldCondition() = %+v, want nil for a consistent condition", c)
	}
	l.Generation = 2
	c := heldCondition(l)
	if c == nil || c.ObservedGeneration != 2 || c.Reason != locksv1alpha1.ReasonAcquired {
		t.Errorf("heldCondition() after a spec change = %+v, want the same condition at generation 2", c)
	}
	desired := desiredStatus(l, decision{}, "", t0)
	if diff := cmp.Diff(l.Status.Conditions[0].LastTransitionTime, desired.Status.Conditions[0].LastTransitionTime); diff != "" {
		t.Errorf("a generation bump must not move lastTransitionTime (-want +got):\n%s", diff)
	}
}

func TestWrittenSinceCreated(t *testing.T) {
	created := metav1.NewTime(t0)
	entry := func(manager string, op metav1.ManagedFieldsOperationType, subresource string, at time.Time) metav1.ManagedFieldsEntry {
		return metav1.ManagedFieldsEntry{Manager: manager, Operation: op, Subresource: subresource, Time: &metav1.Time{Time: at}}
	}
	creator := entry("kubelock", metav1.ManagedFieldsOperationUpdate, "", t0)
	renewals := entry("kubelock", metav1.ManagedFieldsOperationUpdate, "status", t0.Add(time.Hour))
	tests := []struct {
		name    string
		entries []metav1.ManagedFieldsEntry
		want    bool
	}{
		{"as created, with status writes since", []metav1.ManagedFieldsEntry{creator, renewals}, false},
		{"created in the second before creationTimestamp", []metav1.ManagedFieldsEntry{entry("kubelock", metav1.ManagedFieldsOperationUpdate, "", t0.Add(-time.Second))}, false},
		{"a client-side apply by an administrator", []metav1.ManagedFieldsEntry{creator, entry("kubectl-client-side-apply", metav1.ManagedFieldsOperationUpdate, "", t0.Add(time.Hour)), renewals}, true},
		{"a server-side apply by an administrator", []metav1.ManagedFieldsEntry{creator, entry("kubectl", metav1.ManagedFieldsOperationApply, "", t0.Add(time.Hour))}, true},
		{"a client-side apply under the creator's manager name", []metav1.ManagedFieldsEntry{entry("kubectl-client-side-apply", metav1.ManagedFieldsOperationUpdate, "", t0.Add(time.Hour))}, true},
		{"created by a server-side apply", []metav1.ManagedFieldsEntry{entry("kubectl", metav1.ManagedFieldsOperationApply, "", t0)}, true},
		{"no entry for the main resource", []metav1.ManagedFieldsEntry{renewals}, true},
		{"an entry without a time", []metav1.ManagedFieldsEntry{{Manager: "kubelock", Operation: metav1.ManagedFieldsOperationUpdate}}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newLock(autoCreated)
			l.CreationTimestamp, l.ManagedFields = created, tt.entries
			if got := writtenSinceCreated(l); got != tt.want {
				t.Fatalf("writtenSinceCreated = %v, want %v", got, tt.want)
			}
		})
	}
}
