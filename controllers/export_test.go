package controllers

import (
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// RenewalSeen is what r observed of the latest renewal of holding leaseID
// of the lock at key: its renewTime (UnixMicro) and when r first saw it.
func (r *Reconciler) RenewalSeen(key types.NamespacedName, leaseID string) (mark int64, seen time.Time) {
	if obs := r.obs.get(key); obs != nil {
		h := obs.holdings[leaseID]
		return h.renewMark, h.renewSeen
	}
	return 0, time.Time{}
}

// SessionRenewalSeen is what r observed of the latest renewal of the
// session at key: its renewTime (UnixMicro) and when r first saw it.
func (r *Reconciler) SessionRenewalSeen(key types.NamespacedName) (mark int64, seen time.Time) {
	r.sessions.mu.Lock()
	defer r.sessions.mu.Unlock()
	s := r.sessions.m[key]
	return s.renewMark, s.renewSeen
}
