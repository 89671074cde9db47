package cli

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

// now is the fixed clock of the golden files.
var now = time.Date(2026, 5, 4, 12, 0, 0, 0, time.UTC)

func ago(d time.Duration) metav1.MicroTime { return metav1.NewMicroTime(now.Add(-d)) }

func int32p(v int32) *int32 { return &v }

func fixtures() []locksv1alpha1.DistributedLock {
	renewed := ago(4 * time.Second)
	held := locksv1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders-db", UID: "u1",
			CreationTimestamp: metav1.NewTime(now.Add(-3 * time.Hour)),
			Annotations:       map[string]string{locksv1alpha1.KeyAnnotation: "orders-db"}},
		Spec: locksv1alpha1.DistributedLockSpec{LeaseDurationSeconds: 30, MaxLeaseDurationSeconds: 300, MaxWaiters: int32p(128), HandoffTimeoutSeconds: 10},
		Status: locksv1alpha1.DistributedLockStatus{
			Holder: &locksv1alpha1.LockHolder{Identity: "worker-7d9f", User: "system:serviceaccount:shop:worker",
				LeaseID: "2b0c5d1e9f8a7b6c5d4e3f2a1b0c9d8e", RequestID: "8f41aa", LeaseDurationSeconds: 30,
				PodName: "worker-7d9f", PodUID: "6a1f", AcquireTime: ago(2 * time.Minute), RenewTime: &renewed},
			FencingToken: 4711, Transitions: 12,
			Waiters: []locksv1alpha1.Waiter{
				{Identity: "worker-a1", User: "system:serviceaccount:shop:worker", RequestID: "r-a1", EnqueueTime: ago(50 * time.Second), Deadline: metav1.NewMicroTime(now.Add(10 * time.Minute))},
				{Identity: "laptop-ann", User: "ann", RequestID: "r-ann", EnqueueTime: ago(7 * time.Second), Deadline: metav1.NewMicroTime(now.Add(23 * time.Second))},
			},
			WaiterCount: 2,
			RecentAcquisitions: []locksv1alpha1.FinishedHolding{
				{RequestID: "r1", LeaseID: "11aa", FencingToken: 4650, Identity: "worker-5c2b", EndTime: ago(20 * time.Minute), EndReason: locksv1alpha1.EndReasonReleased, EndedBy: "system:serviceaccount:shop:worker"},
				{RequestID: "r2", LeaseID: "22bb", FencingToken: 4702, Identity: "worker-0e4d", EndTime: ago(3 * time.Minute), EndReason: locksv1alpha1.EndReasonForceReleased, EndedBy: "oncall-bob", Message: "stuck job, ticket 42"},
			},
			Conditions: []metav1.Condition{{Type: locksv1alpha1.ConditionHeld, Status: metav1.ConditionTrue, Reason: "Acquired",
				LastTransitionTime: metav1.NewTime(now.Add(-2 * time.Minute)), Message: "held by worker-7d9f"}},
		},
	}
	free := locksv1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders-42-c4dd165f06c3",
			CreationTimestamp: metav1.NewTime(now.Add(-26 * time.Hour)),
			Labels:            map[string]string{locksv1alpha1.AutoCreatedLabel: "true"},
			Annotations:       map[string]string{locksv1alpha1.KeyAnnotation: "orders/42"}},
		Spec:   locksv1alpha1.DistributedLockSpec{LeaseDurationSeconds: 30, MaxLeaseDurationSeconds: 300, MaxWaiters: int32p(128), HandoffTimeoutSeconds: 10},
		Status: locksv1alpha1.DistributedLockStatus{FencingToken: 90},
	}
	overdue := held.DeepCopy()
	overdue.Name, overdue.Annotations = "reports", nil
	late := ago(45 * time.Second)
	overdue.Status.Holder.RenewTime = &late
	overdue.Status.Waiters = nil
	return []locksv1alpha1.DistributedLock{held, free, *overdue}
}

// semaphore is a Semaphore of 3 permits with three holders (one in a
// session, one overdue) and a waiter; rwmutex an RWMutex with two readers, a
// writer queued behind them and a reader behind the writer.
func semaphore() locksv1alpha1.DistributedLock {
	renewed, late := ago(2*time.Second), ago(40*time.Second)
	holder := func(identity, lease string, acquired time.Duration, renew *metav1.MicroTime) locksv1alpha1.LockHolder {
		return locksv1alpha1.LockHolder{Identity: identity, User: "system:serviceaccount:shop:indexer", LeaseID: lease,
			RequestID: "r-" + identity, LeaseDurationSeconds: 30, AcquireTime: ago(acquired), RenewTime: renew}
	}
	inSession := holder("indexer-2", "5e6f", 10*time.Second, nil)
	inSession.Session = "indexer-2-k4m7p"
	return locksv1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "indexers", CreationTimestamp: metav1.NewTime(now.Add(-time.Hour))},
		Spec: locksv1alpha1.DistributedLockSpec{Type: locksv1alpha1.Semaphore, Permits: int32p(3), LeaseDurationSeconds: 30,
			MaxLeaseDurationSeconds: 300, MaxWaiters: int32p(128), HandoffTimeoutSeconds: 10},
		Status: locksv1alpha1.DistributedLockStatus{
			// Stored in acquisition order, not slot order: slot 1 was freed and taken again.
			SharedHolders: []locksv1alpha1.SharedHolder{
				{LockHolder: holder("indexer-0", "1a2b", 5*time.Minute, &renewed), FencingToken: 881, Slot: 0},
				{LockHolder: holder("indexer-3", "3c4d", time.Minute, &late), FencingToken: 907, Slot: 2},
				{LockHolder: inSession, FencingToken: 912, Slot: 1},
			},
			HolderCount: 3, FencingToken: 912, Transitions: 9,
			Waiters: []locksv1alpha1.Waiter{{Identity: "indexer-4", User: "system:serviceaccount:shop:indexer", RequestID: "r-i4",
				Mode: locksv1alpha1.Shared, EnqueueTime: ago(3 * time.Second), Deadline: metav1.NewMicroTime(now.Add(time.Minute))}},
			WaiterCount: 1,
			RecentAcquisitions: []locksv1alpha1.FinishedHolding{
				{RequestID: "r-i1", LeaseID: "0f0e", FencingToken: 899, Identity: "indexer-1", EndTime: ago(30 * time.Second),
					EndReason: locksv1alpha1.EndReasonReleased, EndedBy: "system:serviceaccount:shop:indexer", Slot: int32p(1)},
			},
			Conditions: []metav1.Condition{{Type: locksv1alpha1.ConditionHeld, Status: metav1.ConditionTrue, Reason: "Acquired",
				LastTransitionTime: metav1.NewTime(now.Add(-5 * time.Minute)), Message: "held by indexer-2 with fencing token 912"}},
		},
	}
}

func rwmutex() locksv1alpha1.DistributedLock {
	l := semaphore()
	l.Name, l.Spec.Type, l.Spec.Permits = "catalog", locksv1alpha1.RWMutex, nil
	l.Status.SharedHolders = l.Status.SharedHolders[:2]
	l.Status.HolderCount = 2
	l.Status.Waiters = []locksv1alpha1.Waiter{
		{Identity: "migrator", User: "ann", RequestID: "r-m", Mode: locksv1alpha1.Exclusive, EnqueueTime: ago(8 * time.Second), Deadline: metav1.NewMicroTime(now.Add(time.Minute))},
		{Identity: "reader-9", User: "bob", RequestID: "r-9", Mode: locksv1alpha1.Shared, EnqueueTime: ago(time.Second), Deadline: metav1.NewMicroTime(now.Add(time.Minute))},
	}
	l.Status.WaiterCount = 2
	return l
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./cmd/kubelock/cli -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("%s differs (-want +got; -update rewrites it):\n%s", path, diff)
	}
}

func TestGetTableGolden(t *testing.T) {
	locks := fixtures()
	cases := []struct {
		name  string
		locks []locksv1alpha1.DistributedLock
		all   bool
	}{
		{name: "get_one.golden", locks: locks[:1]},
		{name: "get_list.golden", locks: locks},
		{name: "get_all_namespaces.golden", locks: locks, all: true},
		{name: "get_shared.golden", locks: []locksv1alpha1.DistributedLock{locks[0], semaphore(), rwmutex()}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := printLockTable(&b, tc.locks, now, tc.all); err != nil {
				t.Fatal(err)
			}
			golden(t, tc.name, b.Bytes())
		})
	}
}

func TestDescribeGolden(t *testing.T) {
	locks := fixtures()
	events := []corev1.Event{
		{Type: corev1.EventTypeNormal, Reason: "ForceReleased", Message: "oncall-bob force-released lease 22bb: stuck job, ticket 42",
			ReportingController: "kubelock-controller", EventTime: ago(3 * time.Minute)},
		{Type: corev1.EventTypeNormal, Reason: "Expired", Message: "lease 00ff expired", ReportingController: "kubelock-controller",
			EventTime: ago(time.Hour)},
	}
	cases := []struct {
		name   string
		lock   locksv1alpha1.DistributedLock
		events []corev1.Event
		note   string
	}{
		{name: "describe_held.golden", lock: locks[0], events: events},
		{name: "describe_free.golden", lock: locks[1]},
		{name: "describe_no_events_access.golden", lock: locks[2], note: "<not shown: no permission to list events>"},
		{name: "describe_semaphore.golden", lock: semaphore()},
		{name: "describe_rwmutex.golden", lock: rwmutex()},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := describeLock(&b, &tc.lock, lockDetails{events: tc.events, eventsNote: tc.note}, now); err != nil {
				t.Fatal(err)
			}
			golden(t, tc.name, b.Bytes())
		})
	}
}

func TestLeaseTableGolden(t *testing.T) {
	var b bytes.Buffer
	v := leaseView{Namespace: "shop", Name: "orders-db", Key: "orders-db", Identity: "laptop-ann", FencingToken: 4712,
		LeaseID: "3c1d", RequestID: "r9", ExpiresAt: now.Add(27 * time.Second)}
	if err := printLeases(&b, "table", []leaseView{v}, now); err != nil {
		t.Fatal(err)
	}
	golden(t, "acquire.golden", b.Bytes())
}

func TestSessionsGolden(t *testing.T) {
	renewed := ago(3 * time.Second)
	sessions := []locksv1alpha1.LockSession{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "worker-7d9f-x2k8q", CreationTimestamp: metav1.NewTime(now.Add(-5 * time.Minute))},
			Spec:   locksv1alpha1.LockSessionSpec{User: "system:serviceaccount:shop:worker", Identity: "worker-7d9f", TTLSeconds: 30, PodName: "worker-7d9f", PodUID: "6a1f"},
			Status: locksv1alpha1.LockSessionStatus{RenewTime: &renewed, Locks: 3}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "laptop-ann-q9z7m", CreationTimestamp: metav1.NewTime(now.Add(-2 * time.Second))},
			Spec: locksv1alpha1.LockSessionSpec{User: "ann", Identity: "laptop-ann"}},
	}
	var b bytes.Buffer
	if err := printSessionTable(&b, sessions, now, false); err != nil {
		t.Fatal(err)
	}
	if err := printSessionTable(&b, sessions, now, true); err != nil {
		t.Fatal(err)
	}
	golden(t, "sessions.golden", b.Bytes())

	// A lock held in a session, one of its waiters in another.
	l := fixtures()[0]
	l.Status.Holder.Session, l.Status.Holder.RenewTime = sessions[0].Name, nil
	l.Status.Waiters[1].Session = sessions[1].Name
	var d bytes.Buffer
	if err := printLockTable(&d, []locksv1alpha1.DistributedLock{l}, now, false); err != nil {
		t.Fatal(err)
	}
	if err := describeLock(&d, &l, lockDetails{session: sessions[0].Name + " (of system:serviceaccount:shop:worker, TTL 30s, renewed 3s ago, 3 locks)"}, now); err != nil {
		t.Fatal(err)
	}
	golden(t, "describe_session.golden", d.Bytes())
}

func TestColumnsKeepAlignmentAcrossRows(t *testing.T) {
	var out strings.Builder
	c := columns{w: &out}
	c.fit([]string{"NAME", "HOLDER"}, []string{"a", "<free>"})
	c.print([]string{"NAME", "HOLDER"})
	c.print([]string{"a", "<free>"})
	c.fit([]string{"longer-name", "x"})
	c.print([]string{"longer-name", "x\x1b[2J"})
	want := "NAME   HOLDER\na      <free>\nlonger-name   x\\x1b[2J\n"
	if diff := cmp.Diff(want, out.String()); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}
