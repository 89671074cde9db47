// Package fencing lets a protected resource refuse writes from a lock holder
// whose lease is over (invariant I7): an operation is accepted only if its
// fencing token is at least the highest token accepted before for that lock,
// and the token is recorded atomically with the operation.
//
// A lease decides when someone else may take a lock; only the resource can
// stop a paused former holder's late write. Use postgres.Guard (package
// pkg/fencing/postgres) when the operation itself is SQL, Middleware and
// Transport for HTTP services.
//
// A resource also accepts only tokens the lock issued, as Chubby's
// CheckSequencer does: `highest accepted <= token <= the lock's current
// status.fencingToken`. A Verifier checks the upper bound (APIVerifier reads
// the lock from the apiserver through a cached watch of that one lock), so a
// forged token such as 2^63-1 is refused (ErrNotIssued) and raises nothing:
// the rightful holder is still accepted. The resource names the locks that
// guard it in its own configuration (Fence.Locks, Guard.Do's lock argument);
// a request's header only picks among them. A token is not a credential:
// anyone who may read the lock can read it, so authenticate callers too.
//
// A Semaphore's permits each carry a token of their own, so N permit holders
// can each guard their own resource: name the slot in the LockRef
// ("namespace/name/slot", LockRef.WithSlot; over HTTP the
// Kubelock-Fencing-Slot header, which Transport sets for a shared holding).
// The slot's highest accepted token is then kept under that key apart from
// the other slots', and a Verifier accepts only tokens the lock issued to
// that slot, so one permit's token never fences out, or writes as, another.
//
// MemoryStore keeps the highest token in memory (one replica, tests).
package fencing

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// ErrStaleToken means a higher token was already accepted for the lock.
var ErrStaleToken = errors.New("kubelock: stale fencing token")

// StaleTokenError says which token lost to which; it wraps ErrStaleToken.
type StaleTokenError struct {
	// Lock is the lock key.
	Lock string
	// Token is the token that was refused.
	Token int64
	// Highest is the highest token accepted so far.
	Highest int64
}

func (e *StaleTokenError) Error() string {
	return fmt.Sprintf("kubelock: stale fencing token %d for lock %q: token %d was already accepted", e.Token, e.Lock, e.Highest)
}

// Unwrap makes errors.Is(err, ErrStaleToken) true.
func (e *StaleTokenError) Unwrap() error { return ErrStaleToken }

// Store remembers the highest token accepted per lock.
type Store interface {
	// Accept raises the lock's highest token to token, or returns a
	// *StaleTokenError when a higher one was accepted before. Equal tokens are
	// accepted: one holding may write many times.
	Accept(ctx context.Context, lock string, token int64) error
}

// MemoryStore is a Store for a single replica of a service.
type MemoryStore struct {
	mu      sync.Mutex
	highest map[string]int64
}

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore { return &MemoryStore{highest: map[string]int64{}} }

// Accept implements Store.
func (m *MemoryStore) Accept(_ context.Context, lock string, token int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if h, ok := m.highest[lock]; ok && token < h {
		return &StaleTokenError{Lock: lock, Token: token, Highest: h}
	}
	m.highest[lock] = token
	return nil
}
