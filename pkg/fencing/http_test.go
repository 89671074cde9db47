package fencing

import (
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

func TestMiddleware(t *testing.T) {
	store := NewMemoryStore()
	var served []string
	srv := httptest.NewServer(Middleware(store, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served = append(served, r.Header.Get(HeaderToken))
		w.WriteHeader(http.StatusNoContent)
	})))
	defer srv.Close()

	cases := []struct {
		name        string
		lock, token string
		code        int
		errContains string
	}{
		{name: "first token", lock: "orders", token: "10", code: http.StatusNoContent},
		{name: "equal token", lock: "orders", token: "10", code: http.StatusNoContent},
		{name: "higher token", lock: "orders", token: "12", code: http.StatusNoContent},
		{name: "stale token", lock: "orders", token: "11", code: http.StatusConflict, errContains: "token 12 was already accepted"},
		{name: "another lock is fenced apart", lock: "invoices", token: "1", code: http.StatusNoContent},
		{name: "missing token", lock: "orders", code: http.StatusPreconditionRequired, errContains: "headers are required"},
		{name: "missing lock", token: "13", code: http.StatusPreconditionRequired, errContains: "headers are required"},
		{name: "malformed token", lock: "orders", token: "12abc", code: http.StatusBadRequest, errContains: "positive integer"},
		{name: "negative token", lock: "orders", token: "-5", code: http.StatusBadRequest, errContains: "positive integer"},
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
			if !strings.Contains(body.Error, tc.errContains) {
				t.Fatalf("error %q, want it to contain %q", body.Error, tc.errContains)
			}
		})
	}
	if want := []string{"10", "10", "12", "1"}; strings.Join(served, ",") != strings.Join(want, ",") {
		t.Fatalf("the handler served tokens %v, want %v", served, want)
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
