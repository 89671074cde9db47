package fencing

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

type holding struct {
	key   string
	token int64
}

func (h holding) Key() string         { return h.key }
func (h holding) FencingToken() int64 { return h.token }

// issued is a Verifier over fixed current tokens per lock, as the lock's
// status.fencingToken would give them.
type issued map[LockRef]int64

func (m issued) Verify(_ context.Context, lock LockRef, token int64) error {
	current, ok := m[lock]
	if !ok {
		return notIssued(lock, token, "the lock does not exist")
	}
	if token > current {
		return notIssued(lock, token, "the token is above the lock's current token")
	}
	return nil
}

var (
	ordersLock   = LockRef{Namespace: "shop", Name: "orders"}
	invoicesLock = LockRef{Namespace: "shop", Name: "invoices"}
)

func TestMiddleware(t *testing.T) {
	store := NewMemoryStore()
	var served []string
	f := Fence{
		Locks:    map[string]LockRef{"orders": ordersLock, "invoices": invoicesLock},
		Verifier: issued{ordersLock: 12, invoicesLock: 1},
		Store:    store,
	}
	srv := httptest.NewServer(Middleware(f, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served = append(served, r.Header.Get(HeaderToken))
		w.WriteHeader(http.StatusNoContent)
	})))
	defer srv.Close()

	cases := []struct {
		name        string
		lock, token string
		code        int
		reason      string
		errContains string
	}{
		{name: "first token", lock: "orders", token: "10", code: http.StatusNoContent},
		{name: "equal token", lock: "orders", token: "10", code: http.StatusNoContent},
		{name: "forged token is refused and raises nothing", lock: "orders", token: "9223372036854775807", code: http.StatusForbidden, reason: "not-issued", errContains: "never issued: token 9223372036854775807 by lock shop/orders"},
		{name: "higher token", lock: "orders", token: "12", code: http.StatusNoContent},
		{name: "stale token", lock: "orders", token: "11", code: http.StatusConflict, reason: "stale", errContains: "token 12 was already accepted"},
		{name: "token above the current one", lock: "orders", token: "13", code: http.StatusForbidden, reason: "not-issued", errContains: "above the lock's current token"},
		{name: "another lock is fenced apart", lock: "invoices", token: "1", code: http.StatusNoContent},
		{name: "a lock the resource does not know", lock: "shop/other", token: "1", code: http.StatusForbidden, reason: "unknown-lock", errContains: "does not guard this resource"},
		{name: "missing token", lock: "orders", code: http.StatusPreconditionRequired, reason: "missing", errContains: "headers are required"},
		{name: "missing lock", token: "13", code: http.StatusPreconditionRequired, reason: "missing", errContains: "headers are required"},
		{name: "malformed token", lock: "orders", token: "12abc", code: http.StatusBadRequest, reason: "malformed", errContains: "positive integer"},
		{name: "negative token", lock: "orders", token: "-5", code: http.StatusBadRequest, reason: "malformed", errContains: "positive integer"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, srv.URL, nil)
			if tc.lock != "" {
				req.Header.Set(HeaderLock, tc.lock)
			}
			if tc.token != "" {
				req.Header.Set(HeaderToken, tc.token)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != tc.code {
				t.Fatalf("status = %d, want %d", resp.StatusCode, tc.code)
			}
			if tc.errContains == "" {
				return
			}
			var body errorBody
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
				t.Fatalf("error body is not JSON: %v", err)
			}
			if !strings.Contains(body.Error, tc.errContains) || body.Reason != tc.reason {
				t.Fatalf("error %q (reason %q), want it to contain %q (reason %q)", body.Error, body.Reason, tc.errContains, tc.reason)
			}
		})
	}
	if want := []string{"10", "10", "12", "1"}; strings.Join(served, ",") != strings.Join(want, ",") {
		t.Fatalf("the handler served tokens %v, want %v", served, want)
	}
}

// TestMiddlewareUnverifiable: a verifier that cannot tell yet gives 503 with
// Retry-After, and raises nothing.
func TestMiddlewareUnverifiable(t *testing.T) {
	store := NewMemoryStore()
	notYet := VerifierFunc(func(context.Context, LockRef, int64) error { return ErrNotSynced })
	h := Middleware(Fence{Locks: map[string]LockRef{"orders": ordersLock}, Verifier: notYet, Store: store}, http.NotFoundHandler())
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.Header.Set(HeaderLock, "orders")
	r.Header.Set(HeaderToken, "7")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "1" {
		t.Fatalf("status %d, Retry-After %q", w.Code, w.Header().Get("Retry-After"))
	}
	if err := store.Accept(t.Context(), ordersLock.String(), 1); err != nil {
		t.Fatalf("the unverified token was recorded: %v", err)
	}
}

func TestParseLockRef(t *testing.T) {
	if r, err := ParseLockRef("shop/orders"); err != nil || r != ordersLock || r.String() != "shop/orders" {
		t.Fatalf("ParseLockRef = %v, %v", r, err)
	}
	for _, bad := range []string{"orders", "/orders", "shop/", "a/b/c", ""} {
		if _, err := ParseLockRef(bad); err == nil {
			t.Errorf("ParseLockRef(%q) accepted", bad)
		}
	}
}

func TestTransportSetsHeaders(t *testing.T) {
	var got http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got = r.Header.Clone() }))
	defer srv.Close()
	c := &http.Client{Transport: &Transport{Holding: holding{key: "orders/42", token: 4711}}}
	req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got.Get(HeaderLock) != "orders/42" || got.Get(HeaderToken) != "4711" {
		t.Fatalf("headers %v", got)
	}
	if req.Header.Get(HeaderToken) != "" {
		t.Fatal("the caller's request was modified")
	}
}

func TestMemoryStore(t *testing.T) {
	s := NewMemoryStore()
	for _, tok := range []int64{5, 5, 9} {
		if err := s.Accept(t.Context(), "k", tok); err != nil {
			t.Fatalf("Accept(%d): %v", tok, err)
		}
	}
	err := s.Accept(t.Context(), "k", 8)
	var stale *StaleTokenError
	if !errors.As(err, &stale) || !errors.Is(err, ErrStaleToken) || stale.Highest != 9 {
		t.Fatalf("Accept(8) after 9 = %v", err)
	}
}
