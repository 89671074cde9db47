//go:build faults

package faults

import (
	"encoding/json"
	"os"
	"strings"
	"time"

	"github.com/kubelock/kubelock/test/history"
)

// failoverSteps are the steps of a new leader's takeover, each the first
// line of its log (since its last start) that matches.
var failoverSteps = []struct {
	what  string
	match func(logLine) bool
}{
	{"the standby expires the dead leader's election holding", func(l logLine) bool {
		return l.Msg == "holding ended" && l.Controller == "distributedlock-standby" && l.Reason == "Expired"
	}},
	{"election won", func(l logLine) bool { return l.Msg == "Successfully acquired lease" }},
	{"lock controller's workers started", func(l logLine) bool {
		return l.Msg == "Starting workers" && l.Controller == "distributedlock"
	}},
	{"session controller's workers started", func(l logLine) bool {
		return l.Msg == "Starting workers" && l.Controller == "locksession"
	}},
	{"first holding expired", func(l logLine) bool {
		return l.Msg == "holding ended" && l.Controller == "distributedlock" && l.By == "" &&
			(l.Reason == "Expired" || l.Reason == "SessionExpired")
	}},
}

// logLine is what failoverSteps read of a manager's JSON log line (its
// timestamps in RFC 3339 with nanoseconds: newManager's --zap-time-encoding).
type logLine struct {
	TS         string `json:"ts"`
	Msg        string `json:"msg"`
	Controller string `json:"controller"`
	Reason     string `json:"reason"`
	// By is set on a holding that ended by someone else's write (endedBy).
	By string `json:"endedBy"`
}

// failoverTimeline reads the steps of p's takeover from its log since the
// kill of the old leader (killedAt, history.Mono), on a timeline from there.
func failoverTimeline(p *process, killedAt int64) *timeline {
	tl := newTimeline(killedAt)
	// The log's wall times, as CLOCK_MONOTONIC readings.
	monoNow, wallNow := history.Mono(), time.Now()
	b, err := os.ReadFile(p.logPath())
	if err != nil {
		return tl
	}
	s := string(b)
	if i := strings.LastIndex(s, "==== start"); i >= 0 {
		s = s[i:]
	}
	for _, line := range strings.Split(s, "\n") {
		var l logLine
		if json.Unmarshal([]byte(line), &l) != nil {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, l.TS)
		if err != nil {
			continue
		}
		at := monoNow - int64(wallNow.Sub(t))
		for _, step := range failoverSteps {
			if at >= killedAt && step.match(l) {
				tl.markAt(at, step.what)
			}
		}
	}
	return tl
}
