package main

import (
	"strings"
	"testing"
)

// TestReplicaTargets holds n replicas' highest sustained rate to the
// target's multiple of one replica's, and reports a count that did not run
// as not run, never as met.
func TestReplicaTargets(t *testing.T) {
	run := func(n int, sustained float64) replicaRun {
		return replicaRun{Replicas: n, Mix: &mixResult{Bracket: bracket{Sustained: sustained, NotSustained: sustained + 50}}}
	}
	s := &replicaScale{Quota: 0.4, Runs: []replicaRun{run(1, 100), run(2, 180), run(3, 240)}}
	rows := s.targets()
	if len(rows) != 2 {
		t.Fatalf("got %d rows, want 2", len(rows))
	}
	if !rows[0].met || rows[0].notRun != "" || !strings.HasPrefix(rows[0].figure, "1.80×") {
		t.Errorf("2 replicas at 1.8× one's: got %+v, want met at 1.80×", rows[0])
	}
	if rows[1].met || rows[1].notRun != "" || !strings.HasPrefix(rows[1].figure, "2.40×") {
		t.Errorf("3 replicas at 2.4× one's: got %+v, want missed at 2.40×", rows[1])
	}

	skipped := (&replicaScale{Quota: 0.4, Skipped: "not root"}).targets()
	for _, r := range skipped {
		if r.met || r.notRun != "not root" {
			t.Errorf("skipped scale model: got %+v, want not run, saying why", r)
		}
	}
	cut := (&replicaScale{Quota: 0.4, Runs: []replicaRun{run(1, 100)}}).targets()
	for _, r := range cut {
		if r.met || r.notRun == "" {
			t.Errorf("run ended after one replica: got %+v, want not run", r)
		}
	}
}

// TestThrottledSince is each cgroup's share of throttled periods between
// two counts; a cgroup made in between counts from zero.
func TestThrottledSince(t *testing.T) {
	got := throttledSince([][2]int64{{10, 100}}, [][2]int64{{30, 200}, {5, 50}})
	if len(got) != 2 || got[0] != 0.2 || got[1] != 0.1 {
		t.Errorf("got %v, want [0.2 0.1]", got)
	}
}
