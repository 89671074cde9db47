package rules

import (
	"k8s.io/apimachinery/pkg/util/validation/field"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// requestIDKnown reports whether status answers a retried acquire of id: a
// client finds its request by requestID in the holdings and in
// recentAcquisitions (I6), and requestIDs are visible to every lock user.
// A new holding or queue entry with such an ID would answer another user's
// retry: "request ID … belongs to user …" while it holds, "your lease
// ended" once its record is there (red team). A client never writes one:
// it answers from status instead.
func requestIDKnown(s *locksv1alpha1.DistributedLockStatus, id string) bool {
	if holds(s, func(h *locksv1alpha1.LockHolder) bool { return h.RequestID == id }) {
		return true
	}
	return s.FindFinished(id) != nil
}

// validateFreshRequest refuses a new holding or queue entry, at p, whose
// requestID the old status o knows (requestIDKnown).
func validateFreshRequest(o *locksv1alpha1.DistributedLockStatus, p *field.Path, id string) field.ErrorList {
	if requestIDKnown(o, id) {
		return field.ErrorList{deny(p.Child("requestID"), RuleLeaseID, msgRequestID)}
	}
	return nil
}
