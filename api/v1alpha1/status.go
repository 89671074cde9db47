package v1alpha1

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/resourceversion"
)

// Reasons of the Held condition.
const (
	ReasonAcquired      = "Acquired"
	ReasonReleased      = "Released"
	ReasonExpired       = "Expired"
	ReasonForceReleased = "ForceReleased"
	ReasonNeverHeld     = "NeverHeld"
)

// NextFencingToken is the token an acquisition of an object at resourceVersion rv
// must carry: rv + 1. The write commits at a revision above rv, so the token never
// exceeds its own commit revision and every later acquisition reads a larger one.
func NextFencingToken(rv string) (int64, error) {
	// CompareResourceVersion rejects anything that is not a positive integer
	// without leading zeros, the contract resourceVersions follow since 1.35.
	if _, err := resourceversion.CompareResourceVersion(rv, rv); err != nil {
		return 0, fmt.Errorf("resourceVersion %q is not a comparable integer: %w", rv, err)
	}
	n, err := strconv.ParseInt(rv, 10, 64)
	if err == nil && n == math.MaxInt64 {
		err = strconv.ErrRange
	}
	if err != nil {
		return 0, fmt.Errorf("resourceVersion %q does not fit a fencing token: %w", rv, err)
	}
	return n + 1, nil
}

// IsHeld reports whether the lock has any holding, exclusive or shared.
func (l *DistributedLock) IsHeld() bool {
	return l.Status.Holder != nil || len(l.Status.SharedHolders) > 0
}

// LockType is spec.type with its default applied.
func (l *DistributedLock) LockType() LockType {
	if l.Spec.Type == "" {
		return Mutex
	}
	return l.Spec.Type
}

// SharedLimit is how many shared holdings the lock admits at once: a
// Semaphore's permits, MaxSharedHolders readers of an RWMutex, none for a
// Mutex. A Semaphore stored by an earlier release with more permits than
// MaxSharedHolders admits MaxSharedHolders.
func (l *DistributedLock) SharedLimit() int {
	switch l.LockType() {
	case Semaphore:
		if l.Spec.Permits == nil {
			return 0
		}
		return min(int(*l.Spec.Permits), MaxSharedHolders)
	case RWMutex:
		return MaxSharedHolders
	}
	return 0
}

// Supports reports whether the lock's type can be held in mode m: a Mutex
// only Exclusive, a Semaphore only Shared, an RWMutex both.
func (l *DistributedLock) Supports(m Mode) bool {
	switch l.LockType() {
	case Mutex:
		return m == Exclusive
	case Semaphore:
		return m == Shared
	}
	return m == Exclusive || m == Shared
}

// DefaultMode is the mode an acquire without one asks for: Shared for a
// Semaphore, Exclusive otherwise.
func (l *DistributedLock) DefaultMode() Mode {
	if l.LockType() == Semaphore {
		return Shared
	}
	return Exclusive
}

// Admits reports whether a holding in mode m would fit the lock's holdings
// now; the queue (only its head may acquire) is the caller's concern.
func (l *DistributedLock) Admits(m Mode) bool {
	if !l.Supports(m) || l.Status.Holder != nil {
		return false
	}
	if m == Exclusive {
		return len(l.Status.SharedHolders) == 0
	}
	_, free := l.FreeSlot()
	return free
}

// FreeSlot is the lowest slot below SharedLimit no shared holder occupies.
func (l *DistributedLock) FreeSlot() (int32, bool) {
	limit := l.SharedLimit()
	if len(l.Status.SharedHolders) >= limit {
		return 0, false
	}
	taken := make(map[int32]bool, len(l.Status.SharedHolders))
	for _, h := range l.Status.SharedHolders {
		taken[h.Slot] = true
	}
	for s := range int32(limit) {
		if !taken[s] {
			return s, true
		}
	}
	return 0, false
}

// Holding is one of a lock's holdings, exclusive or shared, with its own
// token; Slot is nil for the exclusive holder. It points into the status it
// was listed from.
// +kubebuilder:object:generate=false
// +k8s:openapi-gen=false
type Holding struct {
	*LockHolder
	Token int64
	Slot  *int32
}

// Holdings lists the lock's holdings, the exclusive holder first, then the
// shared holders in status order. The exclusive holder's token is
// status.fencingToken: nothing is acquired while it holds.
func (s *DistributedLockStatus) Holdings() []Holding {
	out := make([]Holding, 0, len(s.SharedHolders)+1)
	if s.Holder != nil {
		out = append(out, Holding{LockHolder: s.Holder, Token: s.FencingToken})
	}
	for i := range s.SharedHolders {
		sh := &s.SharedHolders[i]
		out = append(out, Holding{LockHolder: &sh.LockHolder, Token: sh.FencingToken, Slot: &sh.Slot})
	}
	return out
}

// SharedIndex is the index in status.sharedHolders of the holding leaseID, or -1.
func (s *DistributedLockStatus) SharedIndex(leaseID string) int {
	for i := range s.SharedHolders {
		if s.SharedHolders[i].LeaseID == leaseID {
			return i
		}
	}
	return -1
}

// MaxWaiters is spec.maxWaiters with its default applied, at most
// MaxWaitersLimit (a lock stored by an earlier release may say more).
func (l *DistributedLock) MaxWaiters() int {
	if l.Spec.MaxWaiters == nil {
		return DefaultMaxWaiters
	}
	return min(int(*l.Spec.MaxWaiters), MaxWaitersLimit)
}

// MaxLease is spec.maxLeaseDurationSeconds with its default applied: the
// longest a holding may outlive its last renewal, its session's TTL included.
func (l *DistributedLock) MaxLease() int32 {
	if l.Spec.MaxLeaseDurationSeconds <= 0 {
		return DefaultMaxLeaseDurationSeconds
	}
	return l.Spec.MaxLeaseDurationSeconds
}

// MaxWaitersPerUser is how many queue entries one user may have:
// spec.maxWaitersPerUser (default applied), but never more than MaxWaiters.
func (l *DistributedLock) MaxWaitersPerUser() int {
	n := DefaultMaxWaitersPerUser
	if l.Spec.MaxWaitersPerUser != nil {
		n = int(*l.Spec.MaxWaitersPerUser)
	}
	return min(n, l.MaxWaiters())
}

// MaxWait is spec.maxWaitSeconds with its default applied: the longest a
// waiter's deadline may lie after its enqueueTime.
func (l *DistributedLock) MaxWait() time.Duration {
	s := l.Spec.MaxWaitSeconds
	if s <= 0 {
		s = DefaultMaxWaitSeconds
	}
	return time.Duration(s) * time.Second
}

// Acquire makes h the holder and gives it token; the caller computed the token
// with NextFencingToken from the object's current resourceVersion. The holder's
// own waiter entry, if any, leaves the queue in the same write.
func (l *DistributedLock) Acquire(h LockHolder, token int64) {
	l.Status.Holder = &h
	l.acquired(h, token)
}

// AcquireShared adds h as a shared holding on slot with token, as Acquire
// does for the exclusive holder; the caller found the slot with FreeSlot.
func (l *DistributedLock) AcquireShared(h LockHolder, slot int32, token int64) {
	l.Status.SharedHolders = append(l.Status.SharedHolders, SharedHolder{LockHolder: h, FencingToken: token, Slot: slot})
	l.acquired(h, token)
}

func (l *DistributedLock) acquired(h LockHolder, token int64) {
	s := &l.Status
	s.FencingToken = token
	s.Transitions++
	s.RemoveWaiter(h.RequestID)
	l.countHolders()
	l.setHeld(metav1.ConditionTrue, ReasonAcquired)
}

// SyncCounts sets holderCount and waiterCount from the lists they count. A
// lock stored before holderCount existed has none while it is held, and the
// schema refuses any write that leaves a count wrong: a client that syncs
// both in every write renews and releases such a lock without waiting for the
// controller to repair it.
func (l *DistributedLock) SyncCounts() {
	l.countHolders()
	l.Status.WaiterCount = int32(len(l.Status.Waiters))
}

func (l *DistributedLock) countHolders() {
	n := len(l.Status.SharedHolders)
	if l.Status.Holder != nil {
		n++
	}
	l.Status.HolderCount = int32(n)
}

// EndHolding removes the holder and records the finished holding in
// recentAcquisitions (the newest last, at most MaxRecentAcquisitions).
func (l *DistributedLock) EndHolding(reason EndReason, endedBy string, now metav1.MicroTime) {
	h := l.Status.Holder
	if h == nil {
		return
	}
	l.Status.Holder = nil
	l.ended(*h, l.Status.FencingToken, nil, reason, endedBy, now)
}

// EndShared removes the shared holding leaseID and records it, as EndHolding
// does for the exclusive holder; it reports whether the holding was there.
func (l *DistributedLock) EndShared(leaseID string, reason EndReason, endedBy string, now metav1.MicroTime) bool {
	s := &l.Status
	i := s.SharedIndex(leaseID)
	if i < 0 {
		return false
	}
	h := s.SharedHolders[i]
	s.SharedHolders = append(s.SharedHolders[:i:i], s.SharedHolders[i+1:]...)
	if len(s.SharedHolders) == 0 {
		s.SharedHolders = nil
	}
	l.ended(h.LockHolder, h.FencingToken, &h.Slot, reason, endedBy, now)
	return true
}

func (l *DistributedLock) ended(h LockHolder, token int64, slot *int32, reason EndReason, endedBy string, now metav1.MicroTime) {
	s := &l.Status
	s.RecentAcquisitions = append(s.RecentAcquisitions, FinishedHolding{
		RequestID:    h.RequestID,
		LeaseID:      h.LeaseID,
		FencingToken: token,
		Identity:     h.Identity,
		EndTime:      now,
		EndReason:    reason,
		EndedBy:      endedBy,
		Slot:         slot,
	})
	if n := len(s.RecentAcquisitions); n > MaxRecentAcquisitions {
		s.RecentAcquisitions = append([]FinishedHolding(nil), s.RecentAcquisitions[n-MaxRecentAcquisitions:]...)
	}
	l.countHolders()
	if l.IsHeld() {
		l.setHeld(metav1.ConditionTrue, ReasonAcquired)
		return
	}
	l.setHeld(metav1.ConditionFalse, string(reason))
}

// FindFinished returns the finished holding created by requestID, if status still remembers it.
func (s *DistributedLockStatus) FindFinished(requestID string) *FinishedHolding {
	for i := range s.RecentAcquisitions {
		if s.RecentAcquisitions[i].RequestID == requestID {
			return &s.RecentAcquisitions[i]
		}
	}
	return nil
}

// WaiterIndex is the queue position of requestID, or -1.
func (s *DistributedLockStatus) WaiterIndex(requestID string) int {
	for i := range s.Waiters {
		if s.Waiters[i].RequestID == requestID {
			return i
		}
	}
	return -1
}

// ModeOrDefault is the waiter's mode with the CRD's default (Exclusive)
// applied, as for a Waiter built in Go without one.
func (w *Waiter) ModeOrDefault() Mode {
	if w.Mode == "" {
		return Exclusive
	}
	return w.Mode
}

// AppendWaiter puts w at the tail of the queue.
func (s *DistributedLockStatus) AppendWaiter(w Waiter) {
	s.Waiters = append(s.Waiters, w)
	s.WaiterCount = int32(len(s.Waiters))
}

// RemoveWaiter drops requestID from the queue and reports whether it was there.
func (s *DistributedLockStatus) RemoveWaiter(requestID string) bool {
	i := s.WaiterIndex(requestID)
	if i < 0 {
		return false
	}
	s.Waiters = append(s.Waiters[:i:i], s.Waiters[i+1:]...)
	if len(s.Waiters) == 0 {
		s.Waiters = nil
	}
	s.WaiterCount = int32(len(s.Waiters))
	return true
}

// setHeld keeps the Held condition in step with the holder in the same write.
// Lock users may write exactly this one condition (admission rule
// "bookkeeping"), so any other condition goes.
func (l *DistributedLock) setHeld(status metav1.ConditionStatus, reason string) {
	var held []metav1.Condition
	if c := meta.FindStatusCondition(l.Status.Conditions, ConditionHeld); c != nil {
		held = append(held, *c)
	}
	meta.SetStatusCondition(&held, metav1.Condition{
		Type:               ConditionHeld,
		Status:             status,
		Reason:             reason,
		Message:            HeldMessage(reason),
		ObservedGeneration: l.Generation,
	})
	l.Status.Conditions = held
	l.Status.ObservedGeneration = l.Generation
}

// HeldMessage is the Held condition's message for reason. It is fixed per
// reason, so it carries nothing of one acquisition: status.holder,
// status.sharedHolders and status.recentAcquisitions say who holds or held
// the lock and with which token. A message naming the holder and token would
// make every acquisition's condition unique bytes for no information.
func HeldMessage(reason string) string {
	switch reason {
	case ReasonAcquired:
		return "held"
	case ReasonReleased:
		return "released"
	case ReasonExpired:
		return "lease expired"
	case ReasonForceReleased:
		return "force-released"
	case string(EndReasonSessionExpired):
		return "session expired"
	case string(EndReasonSessionClosed):
		return "session closed"
	case ReasonNeverHeld:
		return "never held"
	}
	return ""
}
