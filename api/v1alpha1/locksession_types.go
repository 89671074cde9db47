package v1alpha1

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Session bounds and keys shared by the schema, the client, admission and the controller.
const (
	// LockSessionsResource is the plural resource name of LockSession.
	LockSessionsResource = "locksessions"
	// DefaultSessionTTLSeconds is a session's TTL when its creator asks for none.
	DefaultSessionTTLSeconds = 30
	// MinSessionTTLSeconds and MaxSessionTTLSeconds bound spec.ttlSeconds.
	MinSessionTTLSeconds = 5
	MaxSessionTTLSeconds = 3600
	// PodNameExtra and PodUIDExtra are the user extra keys a bound service-account
	// token carries; they name the pod the token is bound to.
	PodNameExtra = "authentication.kubernetes.io/pod-name"
	PodUIDExtra  = "authentication.kubernetes.io/pod-uid"
)

// LockSessionSpec is what a client declares about its session; it never changes.
type LockSessionSpec struct {
	// user is the authenticated name of the client that created the session.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	User string `json:"user"`

	// identity is the client's human-friendly name, by default its pod name or hostname.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[^\p{Cc}\p{Cf}\p{Zl}\p{Zp}]+$`
	Identity string `json:"identity"`

	// ttlSeconds is how long the session lives without a renewal.
	// +optional
	// +kubebuilder:default=30
	// +kubebuilder:validation:Minimum=5
	// +kubebuilder:validation:Maximum=3600
	TTLSeconds int32 `json:"ttlSeconds,omitempty"`

	// podName is the client's pod, taken from its bound service-account token.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	PodName string `json:"podName,omitempty"`

	// podUID is the UID of the client's pod, taken from its bound service-account token.
	// +optional
	// +kubebuilder:validation:MaxLength=36
	// +kubebuilder:validation:Pattern=`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`
	PodUID string `json:"podUID,omitempty"`
}

// LockSessionStatus is the session's liveness, written by its owner, and the
// controller's count of its holdings.
type LockSessionStatus struct {
	// renewTime is when the owner last renewed, by its clock; informational.
	// The controller times the session by its own clock from each change.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^((000[2-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-8][0-9]{3}|9[0-8][0-9]{2}|99[0-8][0-9]|999[0-8])-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]\.[0-9]{6}(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])|(0001-12-31|9999-01-01)T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]\.[0-9]{6}Z)$`
	RenewTime *metav1.MicroTime `json:"renewTime,omitempty"`

	// locks is how many holdings name this session, kept by the controller.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Locks int32 `json:"locks,omitempty"`
}

// LockSession ties the liveness of many holdings to one renewal: a holding that
// names a session is not renewed itself and ends when its session does.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=locksession
// +kubebuilder:printcolumn:name="User",type=string,JSONPath=`.spec.user`
// +kubebuilder:printcolumn:name="Identity",type=string,JSONPath=`.spec.identity`
// +kubebuilder:printcolumn:name="TTL",type=integer,JSONPath=`.spec.ttlSeconds`
// +kubebuilder:printcolumn:name="Renewed",type=date,JSONPath=`.status.renewTime`
// +kubebuilder:printcolumn:name="Locks",type=integer,JSONPath=`.status.locks`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type LockSession struct {
	metav1.TypeMeta `json:",inline"`

	// metadata is the standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec declares the session's owner and TTL; it is immutable.
	// +required
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="a session's spec is immutable"
	Spec LockSessionSpec `json:"spec"`

	// status is the session's liveness.
	// +optional
	Status LockSessionStatus `json:"status,omitempty"`
}

// LockSessionList is a list of LockSessions.
//
// +kubebuilder:object:root=true
type LockSessionList struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard list metadata.
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`
	// items are the sessions.
	Items []LockSession `json:"items"`
}

// TTL is the session's TTL, the default when the field is absent.
func (s *LockSession) TTL() int32 {
	if s.Spec.TTLSeconds == 0 {
		return DefaultSessionTTLSeconds
	}
	return s.Spec.TTLSeconds
}

// SessionRefusal says why a holding or waiter of user (and podUID) may not be
// in session name of namespace ns, stored as s (nil: it does not exist); ""
// when it may. maxLease is the lock's maxLeaseDurationSeconds for a holding
// (a holding lasts its session's TTL past the last renewal), 0 for a waiter.
// Admission refuses such a write with it and the controller ends what the
// policy engine, which cannot read sessions, let through.
func SessionRefusal(ns, name string, s *LockSession, user, podUID string, maxLease int32) string {
	switch {
	case s == nil:
		return fmt.Sprintf("session %s does not exist in namespace %s", name, ns)
	case s.DeletionTimestamp != nil:
		return fmt.Sprintf("session %s is being deleted", name)
	case s.Spec.User != user:
		return fmt.Sprintf("session %s is not the holder's: it belongs to %q, not %q", name, s.Spec.User, user)
	case s.Spec.PodUID != "" && s.Spec.PodUID != podUID:
		return fmt.Sprintf("session %s is bound to pod %s (UID %s); a holding or waiter in it must carry that podUID, not %q", name, s.Spec.PodName, s.Spec.PodUID, podUID)
	case s.Spec.PodUID == "" && podUID != "":
		// Else the pod's holding outlives the pod, renewed by another credential of its account.
		return fmt.Sprintf("session %s is bound to no pod; a holding or waiter of pod UID %q must be in a session of that pod", name, podUID)
	case maxLease > 0 && s.TTL() > maxLease:
		return fmt.Sprintf("session %s has ttlSeconds %d, more than the lock's spec.maxLeaseDurationSeconds %d: a holding in it could outlive the lock's bound", name, s.TTL(), maxLease)
	}
	return ""
}
