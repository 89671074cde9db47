//go:build faults

package faults

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"

	"github.com/kubelock/kubelock/test/history"
)

// timeline records when the steps of a recovery happened (CLOCK_MONOTONIC,
// as every process of the suite records), so that a scenario can say where
// its recovery time went.
type timeline struct {
	from  int64
	mu    sync.Mutex
	marks []timelineMark
}

type timelineMark struct {
	t    int64
	what string
}

// newTimeline counts from the fault's end (a restart), at from.
func newTimeline(from int64) *timeline { return &timeline{from: from} }

// mark records what happened now.
func (tl *timeline) mark(what string) { tl.markAt(history.Mono(), what) }

// markAt records what happened at t; a step marked twice keeps its first time.
func (tl *timeline) markAt(t int64, what string) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	for _, m := range tl.marks {
		if m.what == what {
			return
		}
	}
	tl.marks = append(tl.marks, timelineMark{t, what})
}

// since is how long after the timeline's start what happened; 0 if it did not.
func (tl *timeline) since(what string) int64 {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	for _, m := range tl.marks {
		if m.what == what {
			return m.t - tl.from
		}
	}
	return 0
}

// String lists the steps in time order, each as its offset from the start.
func (tl *timeline) String() string {
	tl.mu.Lock()
	ms := append([]timelineMark(nil), tl.marks...)
	tl.mu.Unlock()
	sort.SliceStable(ms, func(i, j int) bool { return ms[i].t < ms[j].t })
	parts := make([]string, len(ms))
	for i, m := range ms {
		parts[i] = fmt.Sprintf("+%s %s", secs(m.t-tl.from), m.what)
	}
	return strings.Join(parts, ", ")
}

// log writes the timeline to the scenario's log.
func (tl *timeline) log(title string) {
	GinkgoWriter.Printf("%s:\n", title)
	tl.mu.Lock()
	ms := append([]timelineMark(nil), tl.marks...)
	tl.mu.Unlock()
	sort.SliceStable(ms, func(i, j int) bool { return ms[i].t < ms[j].t })
	for _, m := range ms {
		GinkgoWriter.Printf("  +%7s  %s\n", secs(m.t-tl.from), m.what)
	}
}

// watchListening marks "<name> webhook listening" once addr accepts TCP
// connections (controller-runtime listens once the serving certificate is
// loaded), polling until ctx ends.
func (tl *timeline) watchListening(ctx context.Context, name, addr string) {
	go func() {
		if awaitListening(ctx, addr) == nil {
			tl.mark(name + " webhook listening")
		}
	}()
}

// watchLeader marks "<replica> leads" once a replica's log says it acquired
// the leader election since its last start.
func (tl *timeline) watchLeader(ctx context.Context) {
	go func() {
		for ctx.Err() == nil {
			if l := leader(); l != nil {
				tl.mark(l.name + " leads")
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
}
