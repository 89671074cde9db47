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
		{name: "no max wait", opts: []Option{WithMaxWait(0)}, wantErr: "maximum wait"},
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
	c, err := NewFromClient(fake.NewClientBuilder().Build(), WithIdentity("me"), WithMaxWait(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.acquireConfig([]AcquireOption{WaitTimeout(2 * time.Minute)}); err == nil || !strings.Contains(err.Error(), "WithMaxWait") {
		t.Errorf("a wait beyond the bound: error = %v", err)
	}
	if _, err := c.acquireConfig([]AcquireOption{RequestID(strings.Repeat("r", 65))}); err == nil {
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

func TestJitterStaysWithinTenPercent(t *testing.T) {
	for range 1000 {
		if d := renewJitter(time.Second); d < 900*time.Millisecond || d >= 1100*time.Millisecond {
			t.Fatalf("renewJitter(1s) = %s", d)
		}
	}
}
