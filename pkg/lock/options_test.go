package lock

import (
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

func TestNewValidatesOptions(t *testing.T) {
	cases := []struct {
		name    string
		opts    []Option
		wantErr string
	}{
		{name: "defaults", opts: nil},
		{name: "bad namespace", opts: []Option{WithNamespace("Not_A_Namespace")}, wantErr: "namespace"},
		{name: "empty identity", opts: []Option{WithIdentity("")}, wantErr: "identity is empty"},
		{name: "long identity", opts: []Option{WithIdentity(strings.Repeat("x", 254))}, wantErr: "limit is 253"},
		{name: "lease too short", opts: []Option{WithLeaseDuration(500 * time.Millisecond)}, wantErr: "lease duration"},
		{name: "lease too long", opts: []Option{WithLeaseDuration(2 * time.Hour)}, wantErr: "lease duration"},
		{name: "lease not whole seconds", opts: []Option{WithLeaseDuration(1500 * time.Millisecond)}, wantErr: "whole seconds"},
		{name: "no wait timeout", opts: []Option{WithWaitTimeout(0)}, wantErr: "wait timeout must be positive"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// The fake client only satisfies the constructor: nothing here touches the lock protocol.
			_, err := NewFromClient(fake.NewClientBuilder().Build(), append([]Option{WithIdentity("me")}, tc.opts...)...)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestAcquireOptionsAreBounded(t *testing.T) {
	c, err := NewFromClient(fake.NewClientBuilder().Build(), WithIdentity("me"), WithWaitTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.acquireConfig([]AcquireOption{WithWaitTimeout(2 * time.Minute)}); err == nil || !strings.Contains(err.Error(), "WithWaitTimeout") {
		t.Errorf("a wait beyond the bound: error = %v", err)
	}
	if _, err := c.acquireConfig([]AcquireOption{WithRequestID(strings.Repeat("r", 65))}); err == nil {
		t.Error("a 65-character request ID was accepted")
	}
	a, err := c.acquireConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := c.acquireConfig(nil)
	if a.requestID == "" || a.requestID == b.requestID {
		t.Errorf("each call needs a fresh request ID, got %q and %q", a.requestID, b.requestID)
	}
	if a.waitTimeout != time.Minute {
		t.Errorf("default wait = %s, want the client's maximum", a.waitTimeout)
	}
}

// A DefaultOption given to New is every call's default, and given to a call
// it overrides the client's for that call only.
func TestDefaultOptionsOnClientAndCall(t *testing.T) {
	s := &Session{name: "s", ttl: 6 * time.Second}
	c, err := NewFromClient(fake.NewClientBuilder().Build(), WithIdentity("me"),
		WithLeaseDuration(10*time.Second), WithWaitTimeout(time.Minute), WithSession(s))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name      string
		opts      []AcquireOption
		wantLease time.Duration
		wantWait  time.Duration
		wantSess  *Session
	}{
		{name: "client defaults", wantLease: s.ttl, wantWait: time.Minute, wantSess: s},
		{name: "no session on this call", opts: []AcquireOption{WithSession(nil)}, wantLease: 10 * time.Second, wantWait: time.Minute},
		{name: "this call's lease and wait",
			opts:      []AcquireOption{WithSession(nil), WithLeaseDuration(20 * time.Second), WithWaitTimeout(30 * time.Second)},
			wantLease: 20 * time.Second, wantWait: 30 * time.Second},
		{name: "a session's TTL is its lease", opts: []AcquireOption{WithLeaseDuration(20 * time.Second)}, wantLease: s.ttl, wantWait: time.Minute, wantSess: s},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, err := c.acquireConfig(tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if a.lease != tc.wantLease || a.waitTimeout != tc.wantWait || a.session != tc.wantSess {
				t.Errorf("lease %s, wait %s, session %t; want %s, %s, %t", a.lease, a.waitTimeout, a.session != nil, tc.wantLease, tc.wantWait, tc.wantSess != nil)
			}
		})
	}
	if _, err := c.acquireConfig([]AcquireOption{WithSession(nil), WithLeaseDuration(1500 * time.Millisecond)}); err == nil || !strings.Contains(err.Error(), "whole seconds") {
		t.Errorf("a call's lease of 1.5s: error = %v", err)
	}
	if got := c.cfg.call; got.lease != 10*time.Second || got.session != s {
		t.Errorf("a call changed the client's defaults: %+v", got)
	}
}

func TestJitterStaysWithinTenPercent(t *testing.T) {
	for range 1000 {
		if d := renewJitter(time.Second); d < 900*time.Millisecond || d >= 1100*time.Millisecond {
			t.Fatalf("renewJitter(1s) = %s", d)
		}
	}
}
