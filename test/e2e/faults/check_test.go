//go:build faults

package faults

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/jackc/pgx/v5"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubelock/kubelock/test/history"
)

func hasPrefix(key, prefix string) bool { return strings.HasPrefix(key, prefix+"-") }

// result is one row of the report.
type result struct {
	Scenario   string
	Ops        int
	Faults     string
	Violations []history.Violation
	Recovery   string
	Notes      string
}

var (
	reportMu sync.Mutex
	report   []result
)

// events returns every recorded event about keys with prefix, plus all kills.
func events(prefix string) []history.Event {
	all, err := history.ReadFiles(histories...)
	Expect(err).NotTo(HaveOccurred())
	var out []history.Event
	for _, e := range all {
		if hasPrefix(e.Key, prefix) || e.Op == history.OpKill {
			out = append(out, e)
		}
	}
	return out
}

// fenceWrites are the writes PostgreSQL accepted for keys with prefix, in commit order.
func fenceWrites(ctx context.Context, prefix string) []history.Write {
	conn, err := pgx.Connect(ctx, pgDSN)
	Expect(err).NotTo(HaveOccurred())
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT lock_key, token, proc, seq FROM faults_writes WHERE lock_key LIKE $1 ORDER BY id`, prefix+"-%")
	Expect(err).NotTo(HaveOccurred())
	ws, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (history.Write, error) {
		var w history.Write
		err := r.Scan(&w.Key, &w.Token, &w.Proc, &w.Seq)
		return w, err
	})
	Expect(err).NotTo(HaveOccurred())
	return ws
}

// check runs every history check on the keys with prefix, records the
// report row and fails the spec on any violation.
func check(ctx context.Context, row result, prefix string) result {
	evs := events(prefix)
	hs := history.Holdings(evs)
	var vs []history.Violation
	vs = append(vs, history.CheckHoldings(hs)...)
	vs = append(vs, history.CheckRequestIDs(evs)...)
	vs = append(vs, history.CheckStored(evs, hs)...)
	writes := fenceWrites(ctx, prefix)
	vs = append(vs, history.CheckFence(writes, hs)...)
	res, info, nops := history.CheckLinearizable(evs, 3*time.Minute)
	switch res {
	case porcupine.Illegal:
		path := filepath.Join(workDir, prefix+"-linearizability.html")
		if f, err := os.Create(path); err == nil {
			_ = porcupine.Visualize(history.Model(), info, f)
			_ = f.Close()
		}
		// Say where: per key, how far an order got and what could not follow.
		stuck := history.ExplainIllegal(evs, 3*time.Minute)
		for _, s := range stuck {
			vs = append(vs, history.Violation{Invariant: "linearizability", Detail: s.Summary()})
			GinkgoWriter.Printf("linearizability of %s:\n%s", s.Key, s.Report(15))
		}
		vs = append(vs, history.Violation{Invariant: "linearizability", Detail: "the lock history is not linearizable; see " + path})
	case porcupine.Unknown:
		vs = append(vs, history.Violation{Invariant: "linearizability", Detail: "porcupine timed out"})
	}
	for _, e := range evs {
		if e.Phase == history.Invoke && (e.Op == history.OpAcquire || e.Op == history.OpRelease || e.Op == history.OpWrite) {
			row.Ops++
		}
	}
	row.Violations = vs
	if row.Notes != "" {
		row.Notes += "; "
	}
	row.Notes += fmt.Sprintf("%d holdings, %d fenced writes accepted, %d porcupine operations linearizable", len(hs), len(writes), nops)
	reportMu.Lock()
	report = append(report, row)
	reportMu.Unlock()
	AddReportEntry(row.Scenario, fmt.Sprintf("%d ops, faults: %s, violations: %d, recovery: %s, %s", row.Ops, row.Faults, len(vs), row.Recovery, row.Notes))
	GinkgoWriter.Printf("%s: %d ops, faults: %s, violations: %d, recovery: %s; %s\n", row.Scenario, row.Ops, row.Faults, len(vs), row.Recovery, row.Notes)
	var lines []string
	for _, v := range vs {
		GinkgoWriter.Println("  VIOLATION", v)
		lines = append(lines, "VIOLATION "+v.String())
	}
	// The violations in the failure's own message too: gomega shortens a long
	// slice it prints, never the message.
	Expect(vs).To(BeEmpty(), "invariant violations in %s (histories in %s):\n%s", row.Scenario, workDir, strings.Join(lines, "\n"))
	return row
}

func writeReport() {
	reportMu.Lock()
	defer reportMu.Unlock()
	var b strings.Builder
	b.WriteString("| scenario | operations | faults injected | violations | recovery | notes |\n|---|---|---|---|---|---|\n")
	for _, r := range report {
		fmt.Fprintf(&b, "| %s | %d | %s | %d | %s | %s |\n", r.Scenario, r.Ops, r.Faults, len(r.Violations), r.Recovery, r.Notes)
	}
	path := os.Getenv("FAULTS_REPORT")
	if path == "" {
		path = filepath.Join(os.TempDir(), "kubelock-faults-report.md")
	}
	_ = os.WriteFile(path, []byte(b.String()), 0o644)
	fmt.Fprintf(GinkgoWriter, "report (%s):\n%s", path, b.String())
	fmt.Printf("\nkubelock fault-injection report (%s):\n%s", path, b.String())
}

func secs(ns int64) string { return fmt.Sprintf("%.2fs", float64(ns)/1e9) }

// answersSince is the answers the proxy passed on after before was taken, by
// status, as "403×2, 200×1" (most frequent first).
func answersSince(now, before map[int]int64) string {
	type tally struct {
		status int
		n      int64
	}
	var ts []tally
	for status, n := range now {
		if d := n - before[status]; d > 0 {
			ts = append(ts, tally{status, d})
		}
	}
	if len(ts) == 0 {
		return "never"
	}
	slices.SortFunc(ts, func(a, b tally) int { return cmp.Or(cmp.Compare(b.n, a.n), cmp.Compare(a.status, b.status)) })
	parts := make([]string, len(ts))
	for i, t := range ts {
		parts[i] = fmt.Sprintf("%d×%d", t.status, t.n)
	}
	return strings.Join(parts, ", ")
}
