package leaderelection

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

func TestOptionsValidate(t *testing.T) {
	s := time.Second
	for _, c := range []struct {
		name string
		o    Options
		want string // substring of the error; "" means valid
	}{
		{"client-go's defaults", Options{}, ""},
		{"short", Options{LeaseDuration: 8 * s, RenewDeadline: 4 * s, RetryPeriod: 2 * s}, ""},
		{"fraction of a second", Options{LeaseDuration: 1500 * time.Millisecond}, "whole seconds"},
		{"longer than an hour", Options{LeaseDuration: 2 * time.Hour}, "whole seconds"},
		{"negative retry", Options{RetryPeriod: -s}, "must be positive"},
		{"deadline within jitter of the retry", Options{RenewDeadline: 2 * s, RetryPeriod: 2 * s}, "1.2 times the retry period"},
		// 2 s + 10 s leaves 12 s; a 13 s lease minus its 1.3 s margin is 11.7 s.
		{"no room for the leader to stop", Options{LeaseDuration: 13 * s}, "must be shorter than the lease duration minus"},
		{"exactly no room", Options{LeaseDuration: 10 * s, RenewDeadline: 7 * s, RetryPeriod: 2 * s}, "must be shorter"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.o.withDefaults().validate()
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("validate: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("validate: %v, want an error containing %q", err, c.want)
			}
		})
	}
}

func TestNewRejectsInvalidKeysAndTimings(t *testing.T) {
	cfg := &rest.Config{Host: "https://127.0.0.1:1"}
	if _, err := New(cfg, "", Options{}); err == nil {
		t.Error("New accepted an empty key")
	}
	if _, err := New(cfg, "leader", Options{LeaseDuration: 3 * time.Second}); err == nil {
		t.Error("New accepted a 3s lease with client-go's default renew deadline")
	}
}

func TestRecordMapsTheHolder(t *testing.T) {
	acq := metav1.NewMicroTime(time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC))
	ren := metav1.NewMicroTime(acq.Add(5 * time.Second))
	held := &locksv1alpha1.DistributedLock{Status: locksv1alpha1.DistributedLockStatus{
		Holder:      &locksv1alpha1.LockHolder{Identity: "pod-a", LeaseDurationSeconds: 15, AcquireTime: acq, RenewTime: &ren},
		Transitions: 7,
	}}
	if diff := cmp.Diff(&resourcelock.LeaderElectionRecord{
		HolderIdentity: "pod-a", LeaseDurationSeconds: 15, AcquireTime: metav1.NewTime(acq.Time), RenewTime: metav1.NewTime(ren.Time), LeaderTransitions: 7,
	}, record(held)); diff != "" {
		t.Errorf("held lock (-want +got):\n%s", diff)
	}
	free := &locksv1alpha1.DistributedLock{Status: locksv1alpha1.DistributedLockStatus{Transitions: 7}}
	if diff := cmp.Diff(&resourcelock.LeaderElectionRecord{LeaderTransitions: 7}, record(free)); diff != "" {
		t.Errorf("free lock (-want +got):\n%s", diff)
	}
}
