package rules

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// FuzzDecodedTimesAsWritten holds the decoded check, which writes each time
// on its own, to the raw check of the whole status as Go writes it: the
// same denials, at the same paths, for any instant and zone offset in every
// time field of a status.
func FuzzDecodedTimesAsWritten(f *testing.F) {
	for _, t := range []time.Time{
		time.Date(2026, 11, 29, 9, 0, 0, 123456789, time.UTC),
		time.Date(0, 1, 1, 0, 30, 0, 0, time.FixedZone("", 3600)),
		time.Date(9999, 12, 31, 23, 30, 0, 0, time.FixedZone("", -3600)),
		time.Date(1, 6, 1, 0, 0, 0, 0, time.UTC),
		time.Date(1, 12, 31, 23, 0, 0, 0, time.UTC),
		{},
	} {
		_, offset := t.Zone()
		f.Add(t.Unix(), int64(t.Nanosecond()), offset)
	}
	f.Fuzz(func(t *testing.T, sec, nsec int64, offset int) {
		at := time.Unix(sec, nsec).In(time.FixedZone("", offset%(24*3600)))
		s := statusAt(at)
		raw, err := json.Marshal(map[string]any{"status": s})
		if err != nil {
			t.Skip("a time encoding/json cannot write:", err)
		}
		if diff := cmp.Diff(ValidateRawStatusTimes(raw), validateTimes(s)); diff != "" {
			t.Fatalf("%s: the decoded check differs from the raw check of %s (-raw +decoded):\n%s", at, raw, diff)
		}
	})
}

// statusAt is a status with every time field, each at t.
func statusAt(t time.Time) *locksv1alpha1.DistributedLockStatus {
	m := metav1.NewMicroTime(t)
	h := locksv1alpha1.LockHolder{AcquireTime: m, RenewTime: &m}
	return &locksv1alpha1.DistributedLockStatus{
		Holder:             &h,
		SharedHolders:      []locksv1alpha1.SharedHolder{{LockHolder: h}},
		Waiters:            []locksv1alpha1.Waiter{{EnqueueTime: m, Deadline: m}},
		RecentAcquisitions: []locksv1alpha1.FinishedHolding{{EndTime: m}},
		Conditions:         []metav1.Condition{{LastTransitionTime: metav1.NewTime(t)}},
	}
}
