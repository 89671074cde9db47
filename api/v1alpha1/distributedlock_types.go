package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Well-known metadata keys.
const (
	// KeyAnnotation keeps the business key a lock name was derived from.
	KeyAnnotation = "locks.kubelock.io/key"
	// AutoCreatedLabel marks locks a client created on first use; the controller
	// deletes them once they stayed idle long enough.
	AutoCreatedLabel = "locks.kubelock.io/auto-created"
	// ForceDeleteAnnotation allows deleting a lock that is still held.
	ForceDeleteAnnotation = "locks.kubelock.io/force-delete"
	// FencedLabel=true selects an object for the fenced-objects webhook
	// (config/fenced-objects). The apiserver calls the webhook when the old or
	// the new object carries it, so removing it is checked too.
	FencedLabel = "locks.kubelock.io/fenced"
	// FencedByAnnotation names the lock (in the object's namespace) that guards the object.
	FencedByAnnotation = "locks.kubelock.io/fenced-by"
	// FencingTokenAnnotation carries the writer's token; the stored value is the
	// highest token the object accepted.
	FencingTokenAnnotation = "locks.kubelock.io/fencing-token"
	// ForceReleaseVerb is the RBAC verb on distributedlocks that allows breaking a lock.
	ForceReleaseVerb = "force-release"
)

// Bounds shared by the schema, the client and admission. The kubebuilder markers
// below cannot name constants; TestSchemaMatchesConstants keeps the two in step.
const (
	// MaxWaitersLimit is the hard cap on status.waiters whatever spec.maxWaiters says.
	MaxWaitersLimit = 1024
	// MaxRecentAcquisitions is how many finished holdings status keeps.
	MaxRecentAcquisitions = 8
	// MaxConditions is the CRD bound on status.conditions.
	MaxConditions = 8
	// MaxConditionMessage is the longest Held message a lock user may write.
	MaxConditionMessage = 256
	// MaxLeaseDurationSeconds is the longest lease any lock may grant.
	MaxLeaseDurationSeconds = 3600
	// MaxWaitSecondsLimit is the largest spec.maxWaitSeconds.
	MaxWaitSecondsLimit = 86400
	// MaxSharedHolders bounds status.sharedHolders: an RWMutex's readers, and
	// the largest spec.permits of a Semaphore.
	MaxSharedHolders = 1024
	// ConditionHeld is the condition type that is True while the lock has a holder.
	ConditionHeld = "Held"
)

// Spec defaults (the CRD applies them; these are what Go code assumes when a
// field is absent, e.g. in objects built without the apiserver).
const (
	DefaultLeaseDurationSeconds    = 30
	DefaultMaxLeaseDurationSeconds = 300
	DefaultMaxWaiters              = 128
	DefaultMaxWaitersPerUser       = 16
	DefaultMaxWaitSeconds          = 3600
	DefaultHandoffTimeoutSeconds   = 10
)

// Patterns of strings in status. metav1.MicroTime marshals exactly six fractional
// digits and parses only those; metav1.Time parses RFC 3339 with an optional
// fraction. The CRD's "date-time" format alone accepts times neither parses.
// Go writes every time back in UTC, so the set the patterns accept must hold
// the UTC form of each time it accepts, or a lock whose status holds one could
// no longer be written by any Go client: years 0002..9998 with any offset, and
// the day on either side (0001-12-31, 9999-01-01) in UTC only. Go's zero time
// (0001-01-01T00:00:00Z, which it writes as null) and years -1 and 10000 (which
// it cannot parse) are out of reach.
const (
	MicroTimePattern = `^((000[2-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-8][0-9]{3}|9[0-8][0-9]{2}|99[0-8][0-9]|999[0-8])-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]\.[0-9]{6}(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])|(0001-12-31|9999-01-01)T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]\.[0-9]{6}Z)$`
	TimePattern      = `^((000[2-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-8][0-9]{3}|9[0-8][0-9]{2}|99[0-8][0-9]|999[0-8])-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])|(0001-12-31|9999-01-01)T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?Z)$`
	// IdentityPattern refuses control and format characters (terminal escapes,
	// bidi overrides) and line and paragraph separators (a new line to some
	// viewers) in names people read: what internal/escape escapes.
	IdentityPattern = `^[^\p{Cc}\p{Cf}\p{Zl}\p{Zp}]+$`
	// PodNamePattern is a pod's name, a DNS-1123 subdomain, and PodUIDPattern
	// a pod's UID as the apiserver assigns it, a lower-case UUID: the
	// controller reads the pod a holding or waiter names, so nothing else is
	// stored there (a podName such as "../../version" would make that read
	// another URL). The podName and podUID markers say the same.
	PodNamePattern = `^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	PodUIDPattern  = `^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`
)

// EndReason says how a holding ended.
// +kubebuilder:validation:Enum=Released;Expired;ForceReleased;SessionExpired;SessionClosed
type EndReason string

const (
	// EndReasonReleased means the holder released the lock.
	EndReasonReleased EndReason = "Released"
	// EndReasonExpired means the controller saw no renewal for a whole lease.
	EndReasonExpired EndReason = "Expired"
	// EndReasonForceReleased means a user with the force-release verb broke the lock.
	EndReasonForceReleased EndReason = "ForceReleased"
	// EndReasonSessionExpired means the holding's session lapsed: the controller
	// saw no renewal of it for a whole TTL.
	EndReasonSessionExpired EndReason = "SessionExpired"
	// EndReasonSessionClosed means the holding's session was deleted, or is
	// missing or not the holder's own.
	EndReasonSessionClosed EndReason = "SessionClosed"
)

// LockType says who may hold a lock at once.
// +kubebuilder:validation:Enum=Mutex;RWMutex;Semaphore
type LockType string

const (
	// Mutex has one holder at a time (status.holder) and no shared holders.
	Mutex LockType = "Mutex"
	// RWMutex has one writer (status.holder) or up to MaxSharedHolders
	// readers (status.sharedHolders), never both.
	RWMutex LockType = "RWMutex"
	// Semaphore has at most spec.permits holders, each a shared holder on its
	// own slot in [0, permits), and never an exclusive holder.
	Semaphore LockType = "Semaphore"
)

// Mode is how a waiter wants to hold a lock.
// +kubebuilder:validation:Enum=Exclusive;Shared
type Mode string

const (
	// Exclusive is a Mutex's holder or an RWMutex's writer.
	Exclusive Mode = "Exclusive"
	// Shared is an RWMutex's reader or a Semaphore's permit.
	Shared Mode = "Shared"
)

// DistributedLockSpec is what an administrator declares about a lock.
// +kubebuilder:validation:XValidation:rule="self.leaseDurationSeconds <= self.maxLeaseDurationSeconds",message="spec.leaseDurationSeconds must not exceed spec.maxLeaseDurationSeconds",fieldPath=".leaseDurationSeconds"
// +kubebuilder:validation:XValidation:rule="self.type == 'Semaphore' ? has(self.permits) : !has(self.permits)",message="spec.permits is required for a Semaphore and allowed only for it",fieldPath=".permits"
type DistributedLockSpec struct {
	// type says who may hold the lock at once: Mutex (one holder), RWMutex (one
	// writer or many readers) or Semaphore (up to permits holders). Immutable.
	// +optional
	// +kubebuilder:default=Mutex
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.type is immutable; create a new lock instead"
	Type LockType `json:"type,omitempty"`

	// permits is how many may hold a Semaphore at once. It may grow, never shrink.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1024
	// +kubebuilder:validation:XValidation:rule="self >= oldSelf",message="spec.permits may grow but never shrink"
	Permits *int32 `json:"permits,omitempty"`

	// leaseDurationSeconds is the lease a client gets when it asks for none.
	// +optional
	// +kubebuilder:default=30
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=3600
	LeaseDurationSeconds int32 `json:"leaseDurationSeconds,omitempty"`

	// maxLeaseDurationSeconds is the longest lease a client may ask for.
	// +optional
	// +kubebuilder:default=300
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=3600
	MaxLeaseDurationSeconds int32 `json:"maxLeaseDurationSeconds,omitempty"`

	// maxWaiters bounds status.waiters; 0 means nobody may wait.
	// +optional
	// +kubebuilder:default=128
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1024
	MaxWaiters *int32 `json:"maxWaiters,omitempty"`

	// handoffTimeoutSeconds is how long the head waiter may take to claim a free lock
	// before the controller drops it from the queue.
	// +optional
	// +kubebuilder:default=10
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=3600
	HandoffTimeoutSeconds int32 `json:"handoffTimeoutSeconds,omitempty"`

	// maxWaitersPerUser bounds one user's entries in status.waiters; the
	// effective bound is the lower of it and maxWaiters.
	// +optional
	// +kubebuilder:default=16
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1024
	MaxWaitersPerUser *int32 `json:"maxWaitersPerUser,omitempty"`

	// maxWaitSeconds bounds a waiter's wait: deadline - enqueueTime.
	// +optional
	// +kubebuilder:default=3600
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=86400
	MaxWaitSeconds int32 `json:"maxWaitSeconds,omitempty"`
}

// LockHolder is the current holding of a lock. While the lock is held, only
// renewTime may change: admission checks it (rules holder-only and
// holder-fields), not the CRD.
type LockHolder struct {
	// identity is the holder's human-friendly name, by default its pod name or hostname.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[^\p{Cc}\p{Cf}\p{Zl}\p{Zp}]+$`
	Identity string `json:"identity"`

	// user is the authenticated name of the client that acquired the lock.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	User string `json:"user"`

	// leaseID identifies this holding; it is random per acquisition.
	// +required
	// +kubebuilder:validation:MinLength=16
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[0-9a-zA-Z-]+$`
	LeaseID string `json:"leaseID"`

	// requestID is the idempotency key of the acquire that created this holding.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[0-9a-zA-Z._-]+$`
	RequestID string `json:"requestID"`

	// leaseDurationSeconds is how long the holding lasts without a renewal.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=3600
	LeaseDurationSeconds int32 `json:"leaseDurationSeconds"`

	// podName is the holder's pod, when it runs in one.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	PodName string `json:"podName,omitempty"`

	// podUID is the UID of the holder's pod, when it runs in one.
	// +optional
	// +kubebuilder:validation:MaxLength=36
	// +kubebuilder:validation:Pattern=`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`
	PodUID string `json:"podUID,omitempty"`

	// session names the LockSession (in the lock's namespace) whose renewals keep
	// this holding alive; leaseDurationSeconds is then the session's TTL and the
	// holding itself is not renewed.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Session string `json:"session,omitempty"`

	// acquireTime is when the holding began, by the holder's clock; informational.
	// +required
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^((000[2-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-8][0-9]{3}|9[0-8][0-9]{2}|99[0-8][0-9]|999[0-8])-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]\.[0-9]{6}(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])|(0001-12-31|9999-01-01)T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]\.[0-9]{6}Z)$`
	AcquireTime metav1.MicroTime `json:"acquireTime"`

	// renewTime is when the holder last renewed, by its clock; informational.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^((000[2-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-8][0-9]{3}|9[0-8][0-9]{2}|99[0-8][0-9]|999[0-8])-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]\.[0-9]{6}(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])|(0001-12-31|9999-01-01)T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]\.[0-9]{6}Z)$`
	RenewTime *metav1.MicroTime `json:"renewTime,omitempty"`
}

// SharedHolder is one of an RWMutex's readers or a Semaphore's permits. Each
// entry is acquired, renewed, released and expired on its own; while it lasts,
// only renewTime may change. The list is keyed by slot, so admission compares
// an entry with the same slot's old entry (rules holder-only, holder-fields, slot).
type SharedHolder struct {
	LockHolder `json:",inline"`

	// fencingToken is this holding's token: the lock's resourceVersion before
	// the acquisition, plus one.
	// +required
	// +kubebuilder:validation:Minimum=1
	FencingToken int64 `json:"fencingToken"`

	// slot is the permit this holding occupies, distinct among the shared
	// holders: in [0, spec.permits) for a Semaphore, so a resource can fence
	// per permit; in [0, 1024) for an RWMutex's readers.
	// +required
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1023
	Slot int32 `json:"slot"`
}

// Waiter is one entry of a lock's FIFO wait queue.
type Waiter struct {
	// identity is the waiter's human-friendly name.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[^\p{Cc}\p{Cf}\p{Zl}\p{Zp}]+$`
	Identity string `json:"identity"`

	// user is the authenticated name of the client that enqueued.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	User string `json:"user"`

	// requestID is the idempotency key of the acquire that is waiting.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[0-9a-zA-Z._-]+$`
	RequestID string `json:"requestID"`

	// enqueueTime is when the waiter joined the queue; informational.
	// +required
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^((000[2-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-8][0-9]{3}|9[0-8][0-9]{2}|99[0-8][0-9]|999[0-8])-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]\.[0-9]{6}(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])|(0001-12-31|9999-01-01)T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]\.[0-9]{6}Z)$`
	EnqueueTime metav1.MicroTime `json:"enqueueTime"`

	// deadline is when the waiter gives up; the controller removes it afterwards.
	// It is at most spec.maxWaitSeconds after enqueueTime.
	// +required
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^((000[2-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-8][0-9]{3}|9[0-8][0-9]{2}|99[0-8][0-9]|999[0-8])-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]\.[0-9]{6}(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])|(0001-12-31|9999-01-01)T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]\.[0-9]{6}Z)$`
	Deadline metav1.MicroTime `json:"deadline"`

	// podName is the waiter's pod, when it runs in one.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	PodName string `json:"podName,omitempty"`

	// podUID is the UID of the waiter's pod, when it runs in one.
	// +optional
	// +kubebuilder:validation:MaxLength=36
	// +kubebuilder:validation:Pattern=`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`
	PodUID string `json:"podUID,omitempty"`

	// mode is how the waiter wants to hold the lock: Exclusive (a Mutex's only
	// mode, an RWMutex's writer) or Shared (an RWMutex's reader, a Semaphore's
	// only mode).
	// +optional
	// +kubebuilder:default=Exclusive
	Mode Mode `json:"mode,omitempty"`

	// session names the LockSession (in the lock's namespace) the waiter will
	// hold the lock in.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Session string `json:"session,omitempty"`
}

// FinishedHolding records a holding that ended, so a retried acquire can learn
// that its lease is over.
type FinishedHolding struct {
	// requestID is the idempotency key of the acquire that created the holding.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	RequestID string `json:"requestID"`

	// leaseID identified the holding.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	LeaseID string `json:"leaseID"`

	// fencingToken was the holding's token.
	// +required
	// +kubebuilder:validation:Minimum=1
	FencingToken int64 `json:"fencingToken"`

	// identity was the holder's human-friendly name.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[^\p{Cc}\p{Cf}\p{Zl}\p{Zp}]+$`
	Identity string `json:"identity"`

	// endTime is when the holding ended, by the clock of whoever ended it.
	// +required
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^((000[2-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-8][0-9]{3}|9[0-8][0-9]{2}|99[0-8][0-9]|999[0-8])-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]\.[0-9]{6}(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])|(0001-12-31|9999-01-01)T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]\.[0-9]{6}Z)$`
	EndTime metav1.MicroTime `json:"endTime"`

	// endReason says how the holding ended.
	// +required
	EndReason EndReason `json:"endReason"`

	// endedBy is the authenticated name of whoever ended the holding.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	EndedBy string `json:"endedBy"`

	// slot was the holding's permit when it was a shared holding; absent for an
	// exclusive one.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1023
	Slot *int32 `json:"slot,omitempty"`

	// message is a note from whoever ended the holding, such as the reason for a force-release.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Message string `json:"message,omitempty"`
}

// DistributedLockStatus is the lock's state, written only by lock clients and the controller.
//
// The CRD's CEL keeps only what must hold with admission off: bounds, enums,
// holdings that fit the type, a token that never decreases and the counts.
// Who may change what, and how (the transition rules), is admission's, which
// checks every status write anyway (docs/design.md, "The CRD's rules").
// +kubebuilder:validation:XValidation:rule="(has(self.waiters) ? size(self.waiters) : 0) == self.waiterCount",message="waiterCount must equal the number of waiters"
// +kubebuilder:validation:XValidation:rule="(has(self.holder) ? 1 : 0) + (has(self.sharedHolders) ? size(self.sharedHolders) : 0) == self.holderCount",message="holderCount must equal the number of holdings, exclusive and shared"
type DistributedLockStatus struct {
	// holder is the current holding; absent while the lock is free.
	// +optional
	Holder *LockHolder `json:"holder,omitempty"`

	// sharedHolders are an RWMutex's readers or a Semaphore's permits, each with
	// its own token and slot. Keyed by slot, so slots are distinct.
	// +optional
	// +listType=map
	// +listMapKey=slot
	// +kubebuilder:validation:MaxItems=1024
	SharedHolders []SharedHolder `json:"sharedHolders,omitempty"`

	// holderCount is the number of holdings (holder and sharedHolders), kept for
	// printer columns.
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1024
	HolderCount int32 `json:"holderCount"`

	// fencingToken is the token of the most recent acquisition, exclusive or
	// shared. It never decreases; on acquisition it is the lock's previous
	// resourceVersion plus one.
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:XValidation:rule="self >= oldSelf",message="fencingToken must not decrease"
	FencingToken int64 `json:"fencingToken"`

	// transitions counts acquisitions of this lock object.
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	Transitions int64 `json:"transitions"`

	// waiters is the FIFO wait queue; index 0 is the head.
	// +optional
	// +listType=map
	// +listMapKey=requestID
	// +kubebuilder:validation:MaxItems=1024
	Waiters []Waiter `json:"waiters,omitempty"`

	// waiterCount is len(waiters), kept for printer columns.
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1024
	WaiterCount int32 `json:"waiterCount"`

	// recentAcquisitions are the last finished holdings, oldest first.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	RecentAcquisitions []FinishedHolding `json:"recentAcquisitions,omitempty"`

	// observedGeneration is the spec generation the controller last acted on.
	// +optional
	// +kubebuilder:validation:Minimum=0
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// conditions describe the lock; type Held is True while it has a holder.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// DistributedLock is a lock with a lease, a fencing token and a FIFO wait queue.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=dlock,categories=locks
// +kubebuilder:printcolumn:name="Type",type=string,JSONPath=`.spec.type`
// +kubebuilder:printcolumn:name="Holders",type=integer,JSONPath=`.status.holderCount`
// +kubebuilder:printcolumn:name="Holder",type=string,JSONPath=`.status.holder.identity`
// +kubebuilder:printcolumn:name="Token",type=integer,JSONPath=`.status.fencingToken`
// +kubebuilder:printcolumn:name="Waiters",type=integer,JSONPath=`.status.waiterCount`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="User",type=string,JSONPath=`.status.holder.user`,priority=1
// +kubebuilder:printcolumn:name="Lease",type=integer,JSONPath=`.status.holder.leaseDurationSeconds`,priority=1
// +kubebuilder:printcolumn:name="Renewed",type=date,JSONPath=`.status.holder.renewTime`,priority=1
// +kubebuilder:printcolumn:name="Transitions",type=integer,JSONPath=`.status.transitions`,priority=1
// +kubebuilder:validation:XValidation:rule="!has(self.status) || !has(self.status.holder) || self.status.holder.leaseDurationSeconds <= self.spec.maxLeaseDurationSeconds",message="holder.leaseDurationSeconds must not exceed spec.maxLeaseDurationSeconds",fieldPath=".status.holder.leaseDurationSeconds"
// +kubebuilder:validation:XValidation:rule="!has(self.status) || !has(self.status.waiters) || size(self.status.waiters) <= self.spec.maxWaiters",message="the wait queue must not be longer than spec.maxWaiters",fieldPath=".status.waiters"
// +kubebuilder:validation:XValidation:rule="!has(self.status) || !has(self.status.sharedHolders) || size(self.status.sharedHolders) == 0 || self.status.sharedHolders.map(h, h.leaseDurationSeconds).max() <= self.spec.maxLeaseDurationSeconds",message="a shared holding's leaseDurationSeconds must not exceed spec.maxLeaseDurationSeconds",fieldPath=".status.sharedHolders"
// +kubebuilder:validation:XValidation:rule="self.spec.type != 'Mutex' || !has(self.status) || !has(self.status.sharedHolders) || size(self.status.sharedHolders) == 0",message="a Mutex has no shared holders",fieldPath=".status.sharedHolders"
// +kubebuilder:validation:XValidation:rule="self.spec.type != 'RWMutex' || !has(self.status) || !has(self.status.holder) || !has(self.status.sharedHolders) || size(self.status.sharedHolders) == 0",message="an RWMutex has a writer or readers, never both",fieldPath=".status.holder"
// +kubebuilder:validation:XValidation:rule="self.spec.type != 'Semaphore' || !has(self.status) || !has(self.status.holder)",message="a Semaphore has no exclusive holder; its permits are shared holdings",fieldPath=".status.holder"
// +kubebuilder:validation:XValidation:rule="self.spec.type != 'Semaphore' || !has(self.status) || !has(self.status.sharedHolders) || size(self.status.sharedHolders) == 0 || (size(self.status.sharedHolders) <= self.spec.permits && self.status.sharedHolders.map(h, h.slot).max() < self.spec.permits)",message="a Semaphore has at most spec.permits holders, on slots in [0, permits)",fieldPath=".status.sharedHolders"
// +kubebuilder:validation:XValidation:rule="!has(self.status) || !has(self.status.waiters) || self.spec.type == 'RWMutex' || !((self.spec.type == 'Mutex' ? 'Shared' : 'Exclusive') in self.status.waiters.map(w, w.mode))",message="a Mutex's waiters are Exclusive and a Semaphore's are Shared",fieldPath=".status.waiters"
type DistributedLock struct {
	metav1.TypeMeta `json:",inline"`

	// metadata is the standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec declares the lock's limits.
	// +optional
	// +kubebuilder:default={type:Mutex,leaseDurationSeconds:30,maxLeaseDurationSeconds:300,maxWaiters:128,handoffTimeoutSeconds:10,maxWaitersPerUser:16,maxWaitSeconds:3600}
	Spec DistributedLockSpec `json:"spec,omitempty"`

	// status is the lock's state. Its default makes even a never-written status
	// exist, so the token's rule also checks a lock's first status write.
	// +optional
	// +kubebuilder:default={fencingToken:0,transitions:0,waiterCount:0,holderCount:0}
	Status DistributedLockStatus `json:"status,omitempty"`
}

// DistributedLockList is a list of DistributedLocks.
//
// +kubebuilder:object:root=true
type DistributedLockList struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard list metadata.
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`
	// items are the locks.
	Items []DistributedLock `json:"items"`
}
