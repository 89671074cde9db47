package fencing

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

var poolLock = LockRef{Namespace: "shop", Name: "pool"}

func TestParseLockRefWithSlot(t *testing.T) {
	r, err := ParseLockRef("shop/pool/3")
	if err != nil || r.lock() != poolLock || r.Slot == nil || *r.Slot != 3 || r.String() != "shop/pool/3" {
		t.Fatalf("ParseLockRef = %v, %v", r, err)
	}
	if got := poolLock.WithSlot(0).String(); got != "shop/pool/0" {
		t.Fatalf("WithSlot(0) = %q", got)
	}
	if poolLock.Slot != nil {
		t.Fatal("WithSlot changed its receiver")
	}
	for _, bad := range []string{"shop/pool/", "shop/pool/-1", "shop/pool/1024", "shop/pool/03", "shop/pool/+3", "shop/pool/x", "shop/pool/3/4", "shop//3"} {
		if _, err := ParseLockRef(bad); err == nil {
			t.Errorf("ParseLockRef(%q) accepted", bad)
		}
	}
}

// poolAt is a Semaphore's status: current holdings by slot, and finished
// holdings recentAcquisitions records (slot, token).
func poolAt(current int64, holders map[int32]int64, finished ...[2]int64) *locksv1alpha1.DistributedLock {
	l := lockAt(current)
	for slot, token := range holders {
		l.Status.SharedHolders = append(l.Status.SharedHolders, locksv1alpha1.SharedHolder{Slot: slot, FencingToken: token})
	}
	for _, f := range finished {
		slot := int32(f[0])
		l.Status.RecentAcquisitions = append(l.Status.RecentAcquisitions, locksv1alpha1.FinishedHolding{Slot: &slot, FencingToken: f[1]})
	}
	// An exclusive holding's record has no slot: it issued nothing to a slot.
	l.Status.RecentAcquisitions = append(l.Status.RecentAcquisitions, locksv1alpha1.FinishedHolding{FencingToken: 3})
	return l
}

// A slot's token is accepted only if the lock issued it to that slot: its
// current holding or a finished one status records; never another slot's.
func TestVerifySlotIssuance(t *testing.T) {
	v, w := cachedVerifier(t, poolLock, 0, time.Minute)
	w.set(poolAt(12, map[int32]int64{0: 10, 1: 12}, [2]int64{0, 5}))
	ctx := t.Context()
	for _, ok := range []struct {
		slot  int32
		token int64
	}{{0, 10}, {0, 5}, {1, 12}} {
		if err := v.Verify(ctx, poolLock.WithSlot(ok.slot), ok.token); err != nil {
			t.Errorf("token %d of slot %d: %v", ok.token, ok.slot, err)
		}
	}
	if err := v.Verify(ctx, poolLock, 12); err != nil {
		t.Errorf("without a slot, any token up to the lock's: %v", err)
	}
	for _, bad := range []struct {
		slot  int32
		token int64
	}{{0, 12}, {1, 10}, {2, 12}, {0, 3}, {0, 11}} {
		err := v.Verify(ctx, poolLock.WithSlot(bad.slot), bad.token)
		if !errors.Is(err, ErrNotIssued) || !strings.Contains(err.Error(), "slot "+strconv.Itoa(int(bad.slot))) {
			t.Errorf("token %d for slot %d: %v", bad.token, bad.slot, err)
		}
	}

	// A token above the cached one waits for the acquisition that issued it.
	done := make(chan error, 1)
	go func() { done <- v.Verify(ctx, poolLock.WithSlot(2), 14) }()
	w.set(poolAt(14, map[int32]int64{0: 10, 1: 12, 2: 14}))
	if err := <-done; err != nil {
		t.Fatalf("a slot's token the cache caught up to: %v", err)
	}
	if len(v.locks) != 1 {
		t.Fatalf("the verifier watches %d objects for one lock", len(v.locks))
	}
}

// slotIssued is a Verifier over fixed issuance: tokens per slot.
type slotIssued map[int32][]int64

func (m slotIssued) Verify(_ context.Context, lock LockRef, token int64) error {
	for slot, tokens := range m {
		for _, t := range tokens {
			if t == token && (lock.Slot == nil || *lock.Slot == slot) {
				return nil
			}
		}
	}
	return notIssued(lock, token, "not issued to that slot")
}

func TestMiddlewareFencesPerSlot(t *testing.T) {
	store := NewMemoryStore()
	f := Fence{
		Locks:    map[string]LockRef{"pool": poolLock, "pool-2": poolLock.WithSlot(2)},
		Verifier: slotIssued{0: {9, 10}, 1: {8}, 2: {11}},
		Store:    store,
	}
	h := Middleware(f, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	cases := []struct {
		name, lock, token, slot string
		code                    int
		reason                  string
	}{
		{name: "slot 0", lock: "pool", token: "10", slot: "0", code: http.StatusNoContent},
		{name: "slot 1 is fenced apart from slot 0", lock: "pool", token: "8", slot: "1", code: http.StatusNoContent},
		{name: "slot 0's older token is stale", lock: "pool", token: "9", slot: "0", code: http.StatusConflict, reason: "stale"},
		{name: "slot 1's token for slot 0", lock: "pool", token: "8", slot: "0", code: http.StatusForbidden, reason: "not-issued"},
		{name: "malformed slot", lock: "pool", token: "10", slot: "zero", code: http.StatusBadRequest, reason: "malformed"},
		{name: "slot out of range", lock: "pool", token: "10", slot: "1024", code: http.StatusBadRequest, reason: "malformed"},
		{name: "a slot's resource without the slot", lock: "pool-2", token: "11", code: http.StatusForbidden, reason: "wrong-slot"},
		{name: "a slot's resource from another slot", lock: "pool-2", token: "10", slot: "0", code: http.StatusForbidden, reason: "wrong-slot"},
		{name: "a slot's resource from its slot", lock: "pool-2", token: "11", slot: "2", code: http.StatusNoContent},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/", nil)
			r.Header.Set(HeaderLock, tc.lock)
			r.Header.Set(HeaderToken, tc.token)
			if tc.slot != "" {
				r.Header.Set(HeaderSlot, tc.slot)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != tc.code {
				t.Fatalf("status = %d, want %d: %s", w.Code, tc.code, w.Body.String())
			}
			if tc.reason == "" {
				return
			}
			var body errorBody
			if err := json.NewDecoder(w.Body).Decode(&body); err != nil || body.Reason != tc.reason {
				t.Fatalf("body %+v (%v), want reason %q", body, err, tc.reason)
			}
		})
	}
	// The store keeps one highest token per slot, under namespace/name/slot.
	for key, highest := range map[string]int64{"shop/pool/0": 10, "shop/pool/1": 8, "shop/pool/2": 11} {
		var stale *StaleTokenError
		if err := store.Accept(t.Context(), key, highest-1); !errors.As(err, &stale) || stale.Highest != highest {
			t.Errorf("store key %s: %v, want highest %d", key, err, highest)
		}
	}
	if err := store.Accept(t.Context(), "shop/pool", 1); err != nil {
		t.Errorf("a slot's token raised the lock's own key: %v", err)
	}
}

type slotHolding struct {
	holding
	slot   int32
	shared bool
}

func (h slotHolding) Slot() (int32, bool) { return h.slot, h.shared }

func TestTransportSetsTheSlot(t *testing.T) {
	var got http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { got = r.Header.Clone() }))
	defer srv.Close()
	for _, tc := range []struct {
		h    Holding
		want string
	}{
		{slotHolding{holding{"pool", 7}, 3, true}, "3"},
		{slotHolding{holding{"pool", 7}, 0, false}, ""},
		{holding{"pool", 7}, ""},
	} {
		c := &http.Client{Transport: &Transport{Holding: tc.h}}
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		req.Header.Set(HeaderSlot, "9") // a stale header from the caller never passes
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if v := got.Get(HeaderSlot); v != tc.want {
			t.Errorf("%+v: slot header %q, want %q", tc.h, v, tc.want)
		}
	}
}
