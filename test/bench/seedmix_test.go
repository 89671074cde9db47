package main

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// lostLocker hands out holdings whose renewals fail for the first `lost`
// acquisitions (a lease lost in an overloaded step) and succeed after.
type lostLocker struct {
	lost     int64
	acquired atomic.Int64
}

func (l *lostLocker) acquire(context.Context, string) (holding, error) {
	return lostHolding{lost: l.acquired.Add(1) <= l.lost}, nil
}

type lostHolding struct{ lost bool }

func (h lostHolding) renew(context.Context) error {
	if h.lost {
		return errors.New("lock lost")
	}
	return nil
}

func (h lostHolding) release(context.Context) error { return nil }

// TestHeldPopulationReplacesLostHoldings: a holding whose renewal failed
// leaves the population, the next resize acquires another in its place,
// and its lock does not go back to the pool.
func TestHeldPopulationReplacesLostHoldings(t *testing.T) {
	ctx := context.Background()
	l := &lostLocker{lost: 2}
	p := &heldPopulation{sys: l, free: newPool(4), renewEvery: time.Millisecond, cur: &atomic.Pointer[[3]*recorder]{}}
	if err := p.resize(ctx, 2); err != nil {
		t.Fatal(err)
	}
	for _, hl := range p.locks {
		select {
		case <-hl.done: // its renewal failed: it stopped renewing
		case <-time.After(10 * time.Second):
			t.Fatal("a lost holding is still renewing")
		}
	}
	if err := p.resize(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if got := l.acquired.Load(); got != 4 {
		t.Errorf("acquisitions: got %d, want 4 (two in place of the lost)", got)
	}
	for _, hl := range p.locks {
		if hl.failed.Load() {
			t.Error("a lost holding stayed in the population")
		}
	}
	if err := p.resize(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if got := len(p.free); got != 2 {
		t.Errorf("pool after releasing everything: got %d locks, want 2 (the lost ones retired)", got)
	}
}
