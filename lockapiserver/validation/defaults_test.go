package validation

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// TestDefaultsMatchTheCRD decodes objects as the lock apiserver does (Go
// types, then SetLockDefaults) and as the CRD backend does (its structural
// defaulting, then the Go types), and wants the same objects.
func TestDefaultsMatchTheCRD(t *testing.T) {
	locks := loadCRD(t, "distributedlocks")
	for name, raw := range map[string]string{
		"nothing":                 `{}`,
		"an empty spec":           `{"spec":{}}`,
		"an empty status":         `{"status":{}}`,
		"a partial spec":          `{"spec":{"type":"RWMutex","maxLeaseDurationSeconds":60}}`,
		"bounds that take zero":   `{"spec":{"maxWaiters":0,"maxWaitersPerUser":0}}`,
		"a Semaphore":             `{"spec":{"type":"Semaphore","permits":3}}`,
		"a full spec":             `{"spec":{"type":"Mutex","leaseDurationSeconds":5,"maxLeaseDurationSeconds":10,"maxWaiters":2,"handoffTimeoutSeconds":3,"maxWaitersPerUser":1,"maxWaitSeconds":60}}`,
		"waiters without a mode":  `{"status":{"waiters":[{"identity":"a","user":"u","requestID":"r1","enqueueTime":"2026-01-02T15:04:05.000000Z","deadline":"2026-01-02T15:05:05.000000Z"}],"waiterCount":1}}`,
		"waiters with their mode": `{"status":{"waiters":[{"identity":"a","user":"u","requestID":"r1","enqueueTime":"2026-01-02T15:04:05.000000Z","deadline":"2026-01-02T15:05:05.000000Z","mode":"Shared"}],"waiterCount":1}}`,
	} {
		t.Run("DistributedLock/"+name, func(t *testing.T) {
			want := defaultedByCRD[locksv1alpha1.DistributedLock](t, locks, raw)
			got := decode[locksv1alpha1.DistributedLock](t, raw)
			SetLockDefaults(got)
			if d := cmp.Diff(want, got); d != "" {
				t.Errorf("defaults differ from the CRD's (-CRD +Go):\n%s", d)
			}
		})
	}
	sessions := loadCRD(t, "locksessions")
	for name, raw := range map[string]string{
		"no TTL": `{"spec":{"user":"u","identity":"i"}}`,
		"a TTL":  `{"spec":{"user":"u","identity":"i","ttlSeconds":7}}`,
	} {
		t.Run("LockSession/"+name, func(t *testing.T) {
			want := defaultedByCRD[locksv1alpha1.LockSession](t, sessions, raw)
			got := decode[locksv1alpha1.LockSession](t, raw)
			SetSessionDefaults(got)
			if d := cmp.Diff(want, got); d != "" {
				t.Errorf("defaults differ from the CRD's (-CRD +Go):\n%s", d)
			}
		})
	}
}
