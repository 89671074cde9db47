package main

import "testing"

// search runs a rateSearch against a system that sustains exactly the rates
// up to limit, and returns the bracket and the rates offered.
func search(t *testing.T, coarse []float64, limit float64, maxSteps int) (bracket, []float64) {
	t.Helper()
	s := newRateSearch(coarse, 25, 0.05, maxSteps)
	var offered []float64
	for {
		r, ok := s.nextRate()
		if !ok {
			break
		}
		if len(offered) > 50 {
			t.Fatalf("no end after %v", offered)
		}
		offered = append(offered, r)
		s.record(r, r <= limit)
	}
	return s.result(), offered
}

func TestRateSearchBracketsTheLimit(t *testing.T) {
	coarse := []float64{150, 300, 600, 1200, 2400}
	for _, limit := range []float64{160, 299, 300, 301, 417, 599, 1000, 2000} {
		b, offered := search(t, coarse, limit, 20)
		if !(b.Sustained <= limit && limit < b.NotSustained) {
			t.Errorf("limit %.0f: bracket %v does not hold it (offered %v)", limit, b, offered)
		}
		w := b.NotSustained - b.Sustained
		if w > 25 && w > 0.05*(b.NotSustained+b.Sustained) {
			t.Errorf("limit %.0f: bracket %v is wider than 25 writes/s and ±5%% of its middle", limit, b)
		}
		if !b.Narrow {
			t.Errorf("limit %.0f: bracket %v not marked narrow", limit, b)
		}
		for i := 1; i < len(offered); i++ {
			if offered[i] == offered[i-1] {
				t.Errorf("limit %.0f: rate %.0f offered twice in a row: %v", limit, offered[i], offered)
			}
		}
	}
}

func TestRateSearchStepCount(t *testing.T) {
	// 150 ✓ 300 ✓ 600 ✗, then 450, 375 or 525, ...: three bisection steps
	// bring a 300-wide bracket to 37.5 ≤ 5% of ~800.
	_, offered := search(t, []float64{150, 300, 600, 1200, 2400}, 400, 20)
	if len(offered) != 6 {
		t.Errorf("offered %v: want 3 coarse and 3 bisection steps", offered)
	}
}

func TestRateSearchNothingSustained(t *testing.T) {
	b, offered := search(t, []float64{150, 300}, 10, 20)
	if b.Sustained != 0 || b.NotSustained > 25 {
		t.Errorf("bracket %v (offered %v): want nothing sustained and the bisection down to ≤ 25", b, offered)
	}
	if got := b.String(); got != "none sustained; not sustained at 19" {
		t.Errorf("String() = %q", got)
	}
}

func TestRateSearchEverythingSustained(t *testing.T) {
	b, offered := search(t, []float64{300, 150}, 1e9, 20)
	if b.Sustained != 300 || b.NotSustained != 0 || len(offered) != 2 || offered[0] != 150 {
		t.Errorf("bracket %v after %v: want the coarse steps in ascending order, all sustained", b, offered)
	}
}

func TestRateSearchStepLimit(t *testing.T) {
	b, offered := search(t, []float64{150, 300, 600, 1200, 2400}, 400, 4)
	if len(offered) != 4 || b.Narrow || b.Sustained != 300 || b.NotSustained != 450 {
		t.Errorf("bracket %v after %v: want 4 steps, cut off at (300, 450)", b, offered)
	}
}
