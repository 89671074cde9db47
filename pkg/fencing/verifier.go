package fencing

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// LockRef names the DistributedLock that guards a protected resource. The
// resource chooses it in its own configuration; a request never does.
type LockRef struct {
	Namespace string
	Name      string
}

// String is "namespace/name", the key under which a Store keeps the lock's
// highest accepted token.
func (r LockRef) String() string { return r.Namespace + "/" + r.Name }

// ParseLockRef reads "namespace/name".
func ParseLockRef(s string) (LockRef, error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return LockRef{}, fmt.Errorf("kubelock: %q is not a lock reference of the form namespace/name", s)
	}
	return LockRef{Namespace: ns, Name: name}, nil
}

// Verifier checks that the lock guarding a resource issued a token: the token
// is at most the lock's current status.fencingToken. Together with a Store
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
// the lock's current token (a forged or misrouted token). Such a token is
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
