//go:build faults

package faults

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/kubelock/kubelock/test/e2e/faults/wire"
)

// seedOps are the seed mix's operations, in the table's order.
var seedOps = []string{"acquire", "renew", "release"}

// seedPhase is a span of the run, [From, To) in CLOCK_MONOTONIC; an
// operation belongs to the phase it was scheduled in.
type seedPhase struct {
	Name     string
	From, To int64
}

// opStats summarises one operation in one phase. A failed operation counts
// as slower than every one that succeeded: a p99 that reaches the failures
// is failed (math.MaxInt64), not the p99 of the successes.
type opStats struct {
	N, Errors int
	P50, P99  time.Duration
	FirstErr  string
}

type phaseStats struct {
	seedPhase
	Ops map[string]opStats
	// Achieved is the lock writes per second completed in the phase.
	Achieved float64
}

const failed = time.Duration(math.MaxInt64)

func seedStats(phases []seedPhase, samples []wire.Sample) []phaseStats {
	var out []phaseStats
	for _, ph := range phases {
		lat := map[string][]time.Duration{}
		ps := phaseStats{seedPhase: ph, Ops: map[string]opStats{}}
		errs := map[string]int{}
		first := map[string]string{}
		ok := 0
		for _, s := range samples {
			if s.T < ph.From || s.T >= ph.To {
				continue
			}
			d := time.Duration(s.Lat)
			if s.Err != "" {
				d = failed
				errs[s.Op]++
				if first[s.Op] == "" {
					first[s.Op] = s.Err
				}
			} else {
				ok++
			}
			lat[s.Op] = append(lat[s.Op], d)
		}
		for _, op := range seedOps {
			ds := lat[op]
			slices.Sort(ds)
			ps.Ops[op] = opStats{N: len(ds), Errors: errs[op], P50: quantile(ds, 0.50), P99: quantile(ds, 0.99), FirstErr: first[op]}
		}
		ps.Achieved = float64(ok) / time.Duration(ph.To-ph.From).Seconds()
		out = append(out, ps)
	}
	return out
}

// quantile of sorted ds (nearest rank); 0 when there is none.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(ds)))) - 1
	return ds[max(0, min(i, len(ds)-1))]
}

func fmtP(d time.Duration) string {
	if d == failed {
		return "failed"
	}
	return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
}

// seedTable is the latency table, in Markdown.
func seedTable(stats []phaseStats) string {
	var b strings.Builder
	b.WriteString("| phase | length | lock writes/s | acquire p50 | acquire p99 | renew p50 | renew p99 | release p50 | release p99 | operations (acquire/renew/release) | errors |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range stats {
		a, r, l := s.Ops["acquire"], s.Ops["renew"], s.Ops["release"]
		errs := "0"
		if n := a.Errors + r.Errors + l.Errors; n > 0 {
			errs = fmt.Sprintf("%d: %s", n, firstLine(cmp.Or(a.FirstErr, r.FirstErr, l.FirstErr)))
		}
		fmt.Fprintf(&b, "| %s | %.0f s | %.1f | %s | %s | %s | %s | %s | %s | %d/%d/%d | %s |\n",
			s.Name, time.Duration(s.To-s.From).Seconds(), s.Achieved,
			fmtP(a.P50), fmtP(a.P99), fmtP(r.P50), fmtP(r.P99), fmtP(l.P50), fmtP(l.P99), a.N, r.N, l.N, errs)
	}
	return b.String()
}

// seedTimeline is each phase's acquires in spans of step: how many, their
// p99 and the slowest, so that a phase's p99 shows whether a burst (a
// member's catch-up) or the whole phase carried it.
func seedTimeline(phases []seedPhase, samples []wire.Sample, step time.Duration) string {
	var b strings.Builder
	for _, ph := range phases {
		fmt.Fprintf(&b, "%s:", ph.Name)
		for from := ph.From; from < ph.To; from += int64(step) {
			var ds []time.Duration
			for _, s := range samples {
				if s.Op == "acquire" && s.T >= from && s.T < min(from+int64(step), ph.To) {
					ds = append(ds, cmp.Or(failedIf(s.Err), time.Duration(s.Lat)))
				}
			}
			slices.Sort(ds)
			fmt.Fprintf(&b, " [+%.0fs n=%d p99 %s max %s]", time.Duration(from-ph.From).Seconds(), len(ds), fmtP(quantile(ds, 0.99)), fmtP(quantile(ds, 1)))
		}
		b.WriteString("\n")
	}
	return b.String()
}

// failedIf is failed for an operation that failed (err), else 0.
func failedIf(err string) time.Duration {
	if err != "" {
		return failed
	}
	return 0
}
