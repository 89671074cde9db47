package fencing

import (
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// cachedVerifier is an APIVerifier whose view of ref is set by the test, as
// its watch would set it.
func cachedVerifier(t *testing.T, ref LockRef, token int64, catchUp time.Duration) (*APIVerifier, *watchedLock) {
	t.Helper()
	v := NewAPIVerifier(nil, WithCatchUp(catchUp))
	t.Cleanup(v.Close)
	synced := make(chan struct{})
	close(synced)
	w := &watchedLock{ref: ref, synced: synced, changed: make(chan struct{})}
	w.set(lockAt(token))
	v.locks[ref] = w
	return v, w
}

func lockAt(token int64) *locksv1alpha1.DistributedLock {
	l := &locksv1alpha1.DistributedLock{}
	l.Status.FencingToken = token
	return l
}

// A token above the cached one waits for the watch to deliver it (the cache
// lags the apiserver), and is accepted once it does.
func TestVerifyWaitsForTheCacheToCatchUp(t *testing.T) {
	v, w := cachedVerifier(t, ordersLock, 10, time.Minute)
	if err := v.Verify(t.Context(), ordersLock, 10); err != nil {
		t.Fatalf("the current token: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- v.Verify(t.Context(), ordersLock, 11) }()
	w.set(lockAt(11)) // the watch delivers the acquisition that issued 11
	if err := <-done; err != nil {
		t.Fatalf("a token the cache caught up to: %v", err)
	}
}

// Past the catch-up bound, a token above the lock's is never issued; a
// deleted lock issued nothing. Neither message shows the lock's token.
func TestVerifyRefusesUnissuedTokens(t *testing.T) {
	v, w := cachedVerifier(t, ordersLock, 10, 20*time.Millisecond)
	err := v.Verify(t.Context(), ordersLock, 1<<63-1)
	if !errors.Is(err, ErrNotIssued) || regexp.MustCompile(`\b10\b`).MatchString(err.Error()) {
		t.Fatalf("a forged token: %v", err)
	}
	w.gone()
	if err := v.Verify(t.Context(), ordersLock, 5); !errors.Is(err, ErrNotIssued) || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("a deleted lock: %v", err)
	}
	v.Close()
	if err := v.Verify(t.Context(), invoicesLock, 1); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("a closed verifier: %v", err)
	}
}
