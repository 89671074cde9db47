package fencing

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestMetricsCountStaleTokens: the Middleware on a counted store counts each
// stale-token refusal once, and nothing else (not a never-issued token).
func TestMetricsCountStaleTokens(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	f := Fence{Locks: map[string]LockRef{"orders": ordersLock}, Verifier: issued{ordersLock: 5}, Store: m.Store(NewMemoryStore())}
	h := Middleware(f, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	for _, tc := range []struct {
		token string
		code  int
	}{{"5", http.StatusNoContent}, {"4", http.StatusConflict}, {"5", http.StatusNoContent}, {"3", http.StatusConflict}, {"x", http.StatusBadRequest}, {"6", http.StatusForbidden}} {
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r.Header.Set(HeaderLock, "orders")
		r.Header.Set(HeaderToken, tc.token)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != tc.code {
			t.Fatalf("token %s: status %d, want %d", tc.token, w.Code, tc.code)
		}
	}
	if got := testutil.ToFloat64(m.rejections); got != 2 {
		t.Fatalf("rejections = %v, want 2", got)
	}
	// A second NewMetrics on the same registry shares the counter.
	m2, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	if err := m2.Store(NewMemoryStore()).Accept(context.Background(), "x", 1); err != nil {
		t.Fatal(err)
	}
	var nilMetrics *Metrics
	if err := nilMetrics.Count(ErrStaleToken); !errors.Is(err, ErrStaleToken) {
		t.Fatal("a nil Metrics must pass errors through")
	}
}
