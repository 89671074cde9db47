package validation

import (
	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// SetLockDefaults fills in what the DistributedLock CRD defaults. A typed
// field cannot tell absent from zero, so a zero that the schema would refuse
// (every defaulted integer but the two bounds that take 0) counts as absent.
// Status needs nothing: its defaulted counters are never omitted.
func SetLockDefaults(l *locksv1alpha1.DistributedLock) {
	s := &l.Spec
	if s.Type == "" {
		s.Type = locksv1alpha1.Mutex
	}
	orDefault(&s.LeaseDurationSeconds, locksv1alpha1.DefaultLeaseDurationSeconds)
	orDefault(&s.MaxLeaseDurationSeconds, locksv1alpha1.DefaultMaxLeaseDurationSeconds)
	orDefault(&s.HandoffTimeoutSeconds, locksv1alpha1.DefaultHandoffTimeoutSeconds)
	orDefault(&s.MaxWaitSeconds, locksv1alpha1.DefaultMaxWaitSeconds)
	if s.MaxWaiters == nil {
		s.MaxWaiters = ptr.To[int32](locksv1alpha1.DefaultMaxWaiters)
	}
	if s.MaxWaitersPerUser == nil {
		s.MaxWaitersPerUser = ptr.To[int32](locksv1alpha1.DefaultMaxWaitersPerUser)
	}
	for i := range l.Status.Waiters {
		if l.Status.Waiters[i].Mode == "" {
			l.Status.Waiters[i].Mode = locksv1alpha1.Exclusive
		}
	}
}

// SetSessionDefaults fills in what the LockSession CRD defaults.
func SetSessionDefaults(s *locksv1alpha1.LockSession) {
	orDefault(&s.Spec.TTLSeconds, locksv1alpha1.DefaultSessionTTLSeconds)
}

func orDefault(v *int32, d int32) {
	if *v == 0 {
		*v = d
	}
}
