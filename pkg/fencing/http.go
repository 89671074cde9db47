package fencing

import (
	"encoding/json"
	"errors"
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

// errorBody is the JSON answer to a refused request.
type errorBody struct {
	Error   string `json:"error"`
	Lock    string `json:"lock,omitempty"`
	Token   int64  `json:"token,omitempty"`
	Highest int64  `json:"highest,omitempty"`
}

// Middleware passes a request on only when its token is current for its lock:
// 409 Conflict for a stale token, 428 Precondition Required when the headers
// are missing, 400 Bad Request when they are malformed. Each answer is JSON.
func Middleware(store Store, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lock, raw := r.Header.Get(HeaderLock), r.Header.Get(HeaderToken)
		if lock == "" || raw == "" {
			writeError(w, http.StatusPreconditionRequired, errorBody{Error: "fenced resource: the " + HeaderLock + " and " + HeaderToken + " headers are required"})
			return
		}
		token, err := strconv.ParseInt(raw, 10, 64)
		if err != nil || token <= 0 {
			writeError(w, http.StatusBadRequest, errorBody{Error: "fenced resource: " + HeaderToken + " must be a positive integer", Lock: lock})
			return
		}
		var stale *StaleTokenError
		switch err := store.Accept(r.Context(), lock, token); {
		case errors.As(err, &stale):
			writeError(w, http.StatusConflict, errorBody{Error: stale.Error(), Lock: lock, Token: token, Highest: stale.Highest})
			return
		case err != nil:
			writeError(w, http.StatusServiceUnavailable, errorBody{Error: "fenced resource: checking the token: " + err.Error(), Lock: lock, Token: token})
			return
		}
		next.ServeHTTP(w, r)
	})
}

func writeError(w http.ResponseWriter, code int, body errorBody) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(body)
}
