package fencing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
)

// Header names carried by fenced HTTP requests. HeaderSlot is present only
// for a shared holding (a Semaphore's permit, an RWMutex's reader): its slot,
// a decimal integer. Lock keys are arbitrary strings, so the slot travels in
// a header of its own rather than in the key.
const (
	HeaderToken = "Kubelock-Fencing-Token"
	HeaderLock  = "Kubelock-Lock"
	HeaderSlot  = "Kubelock-Fencing-Slot"
)

// Holding is what a fenced request needs of a lock: *lock.Lock satisfies it.
type Holding interface {
	Key() string
	FencingToken() int64
}

// slotted is a Holding that may be one slot of its lock, as *lock.Lock is.
type slotted interface {
	Slot() (int32, bool)
}

// Transport adds the holding's lock key, fencing token and, for a shared
// holding, its slot to every request.
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
	r.Header.Del(HeaderSlot)
	if s, ok := t.Holding.(slotted); ok {
		if slot, shared := s.Slot(); shared {
			r.Header.Set(HeaderSlot, strconv.Itoa(int(slot)))
		}
	}
	return base.RoundTrip(r)
}

// errorBody is the JSON answer to a refused request. Reason is one of
// "missing", "malformed", "unknown-lock", "wrong-slot", "not-issued",
// "stale", "unverified".
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
	// name a lock of its own. A LockRef with a Slot guards the resource of
	// that one slot: only requests of that slot pass. Without one, a request
	// with a Kubelock-Fencing-Slot header is fenced per slot (the store key
	// and issuance are the slot's), one without per lock.
	Locks map[string]LockRef
	// Verifier refuses tokens the lock never issued (APIVerifier, or your own).
	Verifier Verifier
	// Store keeps the highest accepted token per lock (key LockRef.String()).
	Store Store
}

// Middleware passes a request on only when its token was issued by the lock
// guarding the resource and is not lower than the highest accepted for that
// lock, or that slot (`highest accepted <= token <= lock's current token`,
// and a slot's token issued to that slot). Each refusal is JSON: 428
// Precondition Required when the headers are missing, 400 Bad Request when
// they are malformed, 403 Forbidden for a lock key the resource does not know,
// a slot other than the configured one, or a token the lock never issued
// (nothing is raised, so the rightful holder is still accepted), 409 Conflict
// for a stale token, 503 Service Unavailable (Retry-After: 1) when the token
// cannot be checked yet.
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
		if code, body := slotOf(r, &lock); code != 0 {
			writeError(w, code, body)
			return
		}
		if code, body := accept(r.Context(), f, lock, token); code != 0 {
			writeError(w, code, body)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// slotOf applies the request's slot header to lock, the configured
// reference; it returns 0 when the request may go on.
func slotOf(r *http.Request, lock *LockRef) (int, errorBody) {
	raw, sent := r.Header.Get(HeaderSlot), len(r.Header.Values(HeaderSlot)) > 0
	if !sent {
		if lock.Slot != nil {
			return http.StatusForbidden, errorBody{Reason: "wrong-slot", Lock: lock.String(),
				Error: fmt.Sprintf("fenced resource: only the holder of slot %d of the lock may write here; send %s", *lock.Slot, HeaderSlot)}
		}
		return 0, errorBody{}
	}
	slot, err := ParseSlot(raw)
	if err != nil {
		return http.StatusBadRequest, errorBody{Reason: "malformed", Error: "fenced resource: " + HeaderSlot + ": " + err.Error(), Lock: lock.String()}
	}
	if lock.Slot != nil && *lock.Slot != slot {
		return http.StatusForbidden, errorBody{Reason: "wrong-slot", Lock: lock.String(),
			Error: fmt.Sprintf("fenced resource: only the holder of slot %d of the lock may write here, not slot %d", *lock.Slot, slot)}
	}
	*lock = lock.WithSlot(slot)
	return 0, errorBody{}
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
