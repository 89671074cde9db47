package lock

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

func TestCanonicalOrder(t *testing.T) {
	keys := []string{"orders", "Invoices/2026", "accounts"}
	order, err := canonicalOrder(keys)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, i := range order {
		n, _ := NameForKey(keys[i])
		names = append(names, n)
	}
	if !slices.IsSorted(names) {
		t.Fatalf("acquisition order %v is not by object name", names)
	}
	// "Invoices/2026" is not an object name: it maps to a hashed one, and the
	// order follows that name, as every other client computes it.
	if _, err := canonicalOrder([]string{"a", "b", "a"}); err == nil || !strings.Contains(err.Error(), "same lock") {
		t.Fatalf("duplicate keys: %v", err)
	}
	if _, err := canonicalOrder([]string{"ok", ""}); err == nil {
		t.Fatal("an empty key was accepted")
	}
}

// forceEnd ends at most MaxRecentAcquisitions holdings per write, each
// recorded (with its slot) in the same write, and only the targets.
func TestForceEndBoundsOneWrite(t *testing.T) {
	obj := &locksv1alpha1.DistributedLock{Spec: locksv1alpha1.DistributedLockSpec{Type: locksv1alpha1.RWMutex}}
	now := metav1.NewMicroTime(metav1.Now().Time)
	for i := range 10 {
		obj.AcquireShared(locksv1alpha1.LockHolder{LeaseID: fmt.Sprintf("lease-%02d", i), RequestID: fmt.Sprint(i), Identity: "r"}, int32(i), int64(100+i))
	}
	targets := holdingIDs(obj)
	obj.AcquireShared(locksv1alpha1.LockHolder{LeaseID: "newcomer", RequestID: "n", Identity: "r"}, 10, 200)

	if n := forceEnd(obj, targets, "admin", "why", now); n != locksv1alpha1.MaxRecentAcquisitions {
		t.Fatalf("first write ended %d holdings, want %d", n, locksv1alpha1.MaxRecentAcquisitions)
	}
	for _, f := range obj.Status.RecentAcquisitions {
		if f.EndReason != locksv1alpha1.EndReasonForceReleased || f.EndedBy != "admin" || f.Message != "why" || f.Slot == nil {
			t.Fatalf("record %+v", f)
		}
		delete(targets, f.LeaseID)
	}
	if n := forceEnd(obj, targets, "admin", "why", now); n != 2 {
		t.Fatalf("second write ended %d holdings, want 2", n)
	}
	if len(obj.Status.SharedHolders) != 1 || obj.Status.SharedHolders[0].LeaseID != "newcomer" || obj.Status.HolderCount != 1 {
		t.Fatalf("left %+v: only the holding acquired after the first read stays", obj.Status.SharedHolders)
	}
}
