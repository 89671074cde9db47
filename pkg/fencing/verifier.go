package fencing

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// LockRef names the DistributedLock that guards a protected resource, and
// optionally one slot of it. The resource chooses the lock in its own
// configuration; a request never does.
type LockRef struct {
	Namespace string
	Name      string
	// Slot, when set, is one permit of a Semaphore (or one reader slot of an
	// RWMutex): the resource fences that slot on its own, under the key
	// "namespace/name/slot", and accepts only tokens the lock issued to that
	// slot. So N permit holders can each guard their own resource.
	Slot *int32
}

// String is "namespace/name", or "namespace/name/slot" for a slot: the key
// under which a Store keeps the highest accepted token, and the form
// ParseLockRef reads. Lock names never contain "/", so the two never clash.
func (r LockRef) String() string {
	s := r.Namespace + "/" + r.Name
	if r.Slot != nil {
		s += "/" + strconv.Itoa(int(*r.Slot))
	}
	return s
}

// WithSlot is r for one slot of its lock.
func (r LockRef) WithSlot(slot int32) LockRef {
	r.Slot = &slot
	return r
}

// lock is r without a slot: the object a verifier watches.
func (r LockRef) lock() LockRef { return LockRef{Namespace: r.Namespace, Name: r.Name} }

// ParseLockRef reads "namespace/name" or "namespace/name/slot".
func ParseLockRef(s string) (LockRef, error) {
	parts := strings.Split(s, "/")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
		return LockRef{}, fmt.Errorf("kubelock: %q is not a lock reference of the form namespace/name or namespace/name/slot", s)
	}
	ref := LockRef{Namespace: parts[0], Name: parts[1]}
	if len(parts) == 3 {
		slot, err := ParseSlot(parts[2])
		if err != nil {
			return LockRef{}, fmt.Errorf("kubelock: lock reference %q: %w", s, err)
		}
		ref.Slot = &slot
	}
	return ref, nil
}

// ParseSlot reads a slot number: a decimal integer in [0, 1024), the
// schema's range (a reader of a lock stored by an earlier release may hold
// a slot above this release's 64).
func ParseSlot(s string) (int32, error) {
	n, err := strconv.ParseInt(s, 10, 32)
	if err != nil || n < 0 || n >= locksv1alpha1.StoredListLimit || strconv.FormatInt(n, 10) != s {
		return 0, fmt.Errorf("slot %q is not an integer in [0, %d)", s, locksv1alpha1.StoredListLimit)
	}
	return int32(n), nil
}

// Verifier checks that the lock guarding a resource issued a token: the token
// is at most the lock's current status.fencingToken, and for a LockRef with a
// slot, the lock issued it to that slot. Together with a Store
// (highest accepted <= token) this is Chubby's CheckSequencer: a resource
// accepts only `highest accepted <= token <= lock's current token`.
//
// APIVerifier asks the apiserver (through a cached watch); HTTP-only services
// may plug in their own, e.g. one that asks a trusted service.
type Verifier interface {
	// Verify returns nil when lock issued token, an error wrapping
	// ErrNotIssued when it did not, and any other error when
	// it cannot tell (errors.Is(err, ErrNotSynced) while its view of the lock
	// is not ready). It changes nothing.
	Verify(ctx context.Context, lock LockRef, token int64) error
}

// VerifierFunc adapts a function to Verifier.
type VerifierFunc func(ctx context.Context, lock LockRef, token int64) error

// Verify implements Verifier.
func (f VerifierFunc) Verify(ctx context.Context, lock LockRef, token int64) error {
	return f(ctx, lock, token)
}

// ErrNotIssued means the guarding lock never issued the token: it is above
// the lock's current token (a forged or misrouted token), or, for a slot, the
// lock issued it to no holding of that slot it still records. Such a token is
// refused and raises nothing, so the rightful holder is still accepted.
var ErrNotIssued = errors.New("kubelock: fencing token was never issued")

// ErrNotSynced means the verifier cannot yet tell: its watch of the lock has
// not listed the lock yet. Retry shortly (HTTP: 503 with Retry-After).
var ErrNotSynced = errors.New("kubelock: the verifier's view of the lock is not synced yet")

// notIssued says which token lock never issued, and why. It deliberately
// does not name the lock's current token: the caller may be anyone.
func notIssued(lock LockRef, token int64, reason string) error {
	return fmt.Errorf("%w: token %d by lock %s: %s", ErrNotIssued, token, lock, reason)
}
