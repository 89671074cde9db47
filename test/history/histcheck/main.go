// Command histcheck runs the history checks (test/history) over the history
// files a fault-injection run kept (its work dir's history/*.jsonl, with
// FAULTS_KEEP=1 or after a failure) and says which check fails and why: for a
// history that is not linearizable, how far an order of each failing key's
// operations got, the model's states there, and the operations that could
// not come next. The fenced writes live in PostgreSQL and are not checked here.
//
//	go run ./test/history/histcheck -prefix s4 /tmp/kubelock-faults-*/history
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kubelock/kubelock/test/history"
)

func main() {
	prefix := flag.String("prefix", "", "check only keys named <prefix>-N (a scenario's, e.g. s4 or soak)")
	tail := flag.Int("tail", 25, "operations to show before the point a linearization got stuck")
	timeout := flag.Duration("timeout", 3*time.Minute, "porcupine's time limit per key")
	flag.Parse()
	var files []string
	for _, a := range flag.Args() {
		if st, err := os.Stat(a); err == nil && st.IsDir() {
			m, _ := filepath.Glob(filepath.Join(a, "*.jsonl"))
			files = append(files, m...)
			continue
		}
		files = append(files, a)
	}
	all, err := history.ReadFiles(files...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "histcheck:", err)
		os.Exit(2)
	}
	var evs []history.Event
	for _, e := range all {
		if *prefix == "" || strings.HasPrefix(e.Key, *prefix+"-") || e.Op == history.OpKill {
			evs = append(evs, e)
		}
	}
	hs := history.Holdings(evs)
	var vs []history.Violation
	vs = append(vs, history.CheckHoldings(hs)...)
	vs = append(vs, history.CheckRequestIDs(evs)...)
	vs = append(vs, history.CheckStored(evs, hs)...)
	stuck := history.ExplainIllegal(evs, *timeout)
	fmt.Printf("%d events, %d holdings, %d violations, %d keys not linearizable\n", len(evs), len(hs), len(vs), len(stuck))
	for _, v := range vs {
		fmt.Println("VIOLATION", v)
	}
	for _, s := range stuck {
		fmt.Print(s.Report(*tail))
	}
	if len(vs) > 0 || len(stuck) > 0 {
		os.Exit(1)
	}
}
