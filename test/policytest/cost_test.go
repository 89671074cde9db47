package policytest

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	celconfig "k8s.io/apiserver/pkg/apis/cel"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

const controller = "system:serviceaccount:kubelock-system:kubelock-controller-manager"

var now = metav1.NewMicroTime(time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC))

func holding(user string, n int) locksv1alpha1.LockHolder {
	return locksv1alpha1.LockHolder{Identity: fmt.Sprintf("%s-%d", user, n), User: user, LeaseID: fmt.Sprintf("lease-%s-%010d", user, n),
		RequestID: fmt.Sprintf("req-%s-%d", user, n), LeaseDurationSeconds: 30, AcquireTime: now, RenewTime: &now}
}

// atBound is an RWMutex with readers shared holdings of "admin" on slots
// 0..readers-1 and waiters queue entries of "w<i>", at resourceVersion 5000.
func atBound(readers, waiters int) *locksv1alpha1.DistributedLock {
	l := &locksv1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "l", ResourceVersion: "4000", Generation: 1},
		Spec: locksv1alpha1.DistributedLockSpec{Type: locksv1alpha1.RWMutex, MaxWaiters: ptr(int32(locksv1alpha1.StoredListLimit)),
			MaxWaitersPerUser: ptr(int32(locksv1alpha1.StoredListLimit))},
	}
	for i := range readers {
		l.AcquireShared(holding("admin", i), int32(i), int64(1000+i))
	}
	for i := range waiters {
		u := fmt.Sprintf("w%d", i)
		l.Status.AppendWaiter(locksv1alpha1.Waiter{Identity: u, User: u, RequestID: fmt.Sprintf("req-%s-1", u), Mode: locksv1alpha1.Shared,
			EnqueueTime: now, Deadline: metav1.NewMicroTime(now.Add(time.Minute))})
	}
	for i := range locksv1alpha1.MaxRecentAcquisitions {
		l.Status.RecentAcquisitions = append(l.Status.RecentAcquisitions, locksv1alpha1.FinishedHolding{RequestID: fmt.Sprintf("old-%d", i),
			LeaseID: fmt.Sprintf("lease-old-%010d", i), FencingToken: int64(900 + i), Identity: "old", EndTime: now,
			EndReason: locksv1alpha1.EndReasonReleased, EndedBy: "old", Slot: ptr(int32(i))})
	}
	l.ResourceVersion = "5000"
	return l
}

func ptr[T any](v T) *T { return &v }

func renewed(h *locksv1alpha1.SharedHolder) {
	t := metav1.NewMicroTime(h.RenewTime.Add(time.Second))
	h.RenewTime = &t
}

// TestCostAtTheBound measures what the status policy's validations cost for
// the writes of a lock at the schema's bounds: 1,024 shared holders, 1,024
// waiters, 8 records (as a lock stored by an earlier release may have them;
// no write grows a list past 64 shared holders or 128 waiters, so the
// largest acquisition is the 64th reader's, next to 1,024 waiters). Each must fit the apiserver's
// budget (celconfig.RuntimeCELCostBudget for the whole policy, PerCallLimit
// for each expression and variable, or the evaluation fails); a hostile
// write must be denied by its rule, not by the budget. The figures go to
// docs/security.md: go test -v -run TestCostAtTheBound ./test/policytest/
func TestCostAtTheBound(t *testing.T) {
	p, err := Load(controller)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		old    *locksv1alpha1.DistributedLock
		edit   func(*locksv1alpha1.DistributedLock)
		writer string
		deny   string // "" = admitted, else the start of the denial
	}{
		{"the 64th reader (the queue's head, 1,024 waiters)", atBound(locksv1alpha1.MaxSharedHolders-1, 1024), func(l *locksv1alpha1.DistributedLock) {
			l.AcquireShared(holding("w0", 1), locksv1alpha1.MaxSharedHolders-1, 5001)
			l.Status.Holder = nil
		}, "w0", ""},
		{"a reader renewing its entry", atBound(1024, 1024), func(l *locksv1alpha1.DistributedLock) { renewed(&l.Status.SharedHolders[700]) }, "admin", ""},
		{"one user renewing its 1,024 entries", atBound(1024, 1024), func(l *locksv1alpha1.DistributedLock) {
			for i := range l.Status.SharedHolders {
				renewed(&l.Status.SharedHolders[i])
			}
		}, "admin", ""},
		{"another user renewing all 1,024 entries", atBound(1024, 1024), func(l *locksv1alpha1.DistributedLock) {
			for i := range l.Status.SharedHolders {
				renewed(&l.Status.SharedHolders[i])
			}
		}, "mallory", "[kubelock:holder-only]"},
		{"a reader releasing", atBound(1024, 1024), func(l *locksv1alpha1.DistributedLock) {
			l.EndShared("lease-admin-0000000700", locksv1alpha1.EndReasonReleased, "admin", now)
		}, "admin", ""},
		{"the controller expiring 8 entries", atBound(1024, 1024), func(l *locksv1alpha1.DistributedLock) {
			for i := range 8 {
				l.EndShared(fmt.Sprintf("lease-admin-%010d", 100+i), locksv1alpha1.EndReasonExpired, controller, now)
			}
		}, controller, ""},
		{"the controller expiring 9 entries", atBound(1024, 1024), func(l *locksv1alpha1.DistributedLock) {
			for i := range 9 {
				l.EndShared(fmt.Sprintf("lease-admin-%010d", 100+i), locksv1alpha1.EndReasonExpired, controller, now)
			}
		}, controller, "[kubelock:end-record] one write may end at most 8 holdings"},
		{"removing 1,024 entries unrecorded", atBound(1024, 1024), func(l *locksv1alpha1.DistributedLock) {
			l.Status.SharedHolders, l.Status.HolderCount = nil, 0
		}, "admin", "[kubelock:end-record] one write may end at most 8 holdings"},
		{"every entry moved to another slot", atBound(1024, 0), func(l *locksv1alpha1.DistributedLock) {
			for i := range l.Status.SharedHolders {
				l.Status.SharedHolders[i].Slot = int32(1023 - i)
			}
		}, "admin", "[kubelock:holder-only] a shared holding cannot pass to another leaseID"},
		{"a reader beyond the cap", atBound(locksv1alpha1.MaxSharedHolders, 1024), func(l *locksv1alpha1.DistributedLock) {
			l.AcquireShared(holding("w0", 1), locksv1alpha1.MaxSharedHolders, 5001)
			l.Status.Holder = nil
		}, "w0", "[kubelock:slot] slot 64 is out of range"},
		{"a 1,024th waiter joining", atBound(1024, 1023), func(l *locksv1alpha1.DistributedLock) {
			l.Status.AppendWaiter(locksv1alpha1.Waiter{Identity: "x", User: "x", RequestID: "req-x", Mode: locksv1alpha1.Shared,
				EnqueueTime: now, Deadline: metav1.NewMicroTime(now.Add(time.Minute))})
		}, "x", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			next := tc.old.DeepCopy()
			tc.edit(next)
			msg, cost, err := p.Judge(context.Background(), tc.old, next, Writer{Name: tc.writer})
			if err != nil {
				t.Fatalf("%v (cost %d)", err, cost)
			}
			switch {
			case tc.deny == "" && msg != "":
				t.Fatalf("denied: %s", msg)
			case tc.deny != "" && (len(msg) < len(tc.deny) || msg[:len(tc.deny)] != tc.deny):
				t.Fatalf("got %q, want a denial starting %q", msg, tc.deny)
			}
			t.Logf("cost %d of %d (%.1f%%)", cost, celconfig.RuntimeCELCostBudget, 100*float64(cost)/celconfig.RuntimeCELCostBudget)
		})
	}
}
