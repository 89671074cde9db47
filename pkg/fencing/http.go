package fencing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
)

// Header names carried by fenced HTTP requests.
const (
	HeaderToken = "Kubelock-Fencing-Token"
	HeaderLock  = "Kubelock-Lock"
)

// Holding is what a fenced request needs of a lock: *lock.Lock satisfies it.
type Holding interface {
	Key() string
	FencingToken() int64
}

// Transport adds the holding's lock key and fencing token to every request.
type Transport struct {
	// Holding supplies the headers.
	Holding Holding
	// Base sends the request; nil means http.DefaultTransport.
	Base http.RoundTripper
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(r *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	r = r.Clone(r.Context())
	r.Header.Set(HeaderLock, t.Holding.Key())
	r.Header.Set(HeaderToken, strconv.FormatInt(t.Holding.FencingToken(), 10))
	return base.RoundTrip(r)
}

// errorBody is the JSON answer to a refused request. Reason is one of
// "missing", "malformed", "unknown-lock", "not-issued", "stale", "unverified".
type errorBody struct {
	Error   string `json:"error"`
	Reason  string `json:"reason"`
	Lock    string `json:"lock,omitempty"`
	Token   int64  `json:"token,omitempty"`
	Highest int64  `json:"highest,omitempty"`
}

// Fence is a protected HTTP resource's fencing configuration: which locks
// guard it, who verifies that a token was issued, and where the highest
// accepted token per lock is kept.
type Fence struct {
	// Locks maps the lock key a client sends in the Kubelock-Lock header
	// (Holding.Key, as Transport sends it) to the lock that guards the
	// resource. The resource owns this map: a key that is not in it is
	// refused, so a request can pick among the configured locks but never
	// name a lock of its own.
	Locks map[string]LockRef
	// Verifier refuses tokens the lock never issued (APIVerifier, or your own).
	Verifier Verifier
	// Store keeps the highest accepted token per lock (key LockRef.String()).
	Store Store
}

// Middleware passes a request on only when its token was issued by the lock
// guarding the resource and is not lower than the highest accepted for that
// lock (`highest accepted <= token <= lock's current token`). Each refusal is
// JSON: 428 Precondition Required when the headers are missing, 400 Bad
// Request when they are malformed, 403 Forbidden for a lock key the resource
// does not know or a token the lock never issued (nothing is raised, so the
// rightful holder is still accepted), 409 Conflict for a stale token, 503
// Service Unavailable (Retry-After: 1) when the token cannot be checked yet.
//
// Verifier and Store are required (Middleware panics without them).
func Middleware(f Fence, next http.Handler) http.Handler {
	if f.Verifier == nil || f.Store == nil {
		panic("fencing.Middleware: Fence.Verifier and Fence.Store are required")
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, raw := r.Header.Get(HeaderLock), r.Header.Get(HeaderToken)
		if key == "" || raw == "" {
			writeError(w, http.StatusPreconditionRequired, errorBody{Reason: "missing", Error: "fenced resource: the " + HeaderLock + " and " + HeaderToken + " headers are required"})
			return
		}
		lock, ok := f.Locks[key]
		if !ok {
			writeError(w, http.StatusForbidden, errorBody{Reason: "unknown-lock", Error: fmt.Sprintf("fenced resource: lock %q does not guard this resource", key)})
			return
		}
		token, err := strconv.ParseInt(raw, 10, 64)
		if err != nil || token <= 0 {
			writeError(w, http.StatusBadRequest, errorBody{Reason: "malformed", Error: "fenced resource: " + HeaderToken + " must be a positive integer", Lock: lock.String()})
			return
		}
		if code, body := accept(r.Context(), f, lock, token); code != 0 {
			writeError(w, code, body)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// accept verifies issuance first (it changes nothing), then raises the
// store; it returns 0 when the request may pass.
func accept(ctx context.Context, f Fence, lock LockRef, token int64) (int, errorBody) {
	body := errorBody{Lock: lock.String(), Token: token}
	err := f.Verifier.Verify(ctx, lock, token)
	if err == nil {
		err = f.Store.Accept(ctx, lock.String(), token)
	}
	var stale *StaleTokenError
	switch {
	case err == nil:
		return 0, body
	case errors.Is(err, ErrNotIssued):
		body.Reason, body.Error = "not-issued", err.Error()
		return http.StatusForbidden, body
	case errors.As(err, &stale):
		body.Reason, body.Error, body.Highest = "stale", stale.Error(), stale.Highest
		return http.StatusConflict, body
	default:
		body.Reason, body.Error = "unverified", "fenced resource: checking the token: "+err.Error()
		return http.StatusServiceUnavailable, body
	}
}

func writeError(w http.ResponseWriter, code int, body errorBody) {
	w.Header().Set("Content-Type", "application/json")
	if code == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(body)
}
