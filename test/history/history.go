// Package history records what lock clients did and saw, as JSON lines with
// CLOCK_MONOTONIC times that every process on one machine shares, and checks
// such histories: confirmed holding intervals never overlap (I1), tokens grow
// in hold order (I2), one request ID never yields two holdings (I6), a fenced
// resource only accepts the highest token so far (I7), and the lock histories
// are linearizable against a model of one lock (porcupine).
//
// The fault-injection suite (test/e2e/faults) writes one file per client
// process; the checks know nothing about how the events were produced.
package history

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Operation kinds.
const (
	OpAcquire  = "acquire"  // invoke/return; return carries Lease, Token, Outcome
	OpRelease  = "release"  // invoke/return
	OpWrite    = "write"    // invoke/return of one fenced write; Outcome ok or stale
	OpLost     = "lost"     // event: the holding's Done fired with ErrLockLost
	OpDeadline = "deadline" // event: the client's safe deadline of Lease is now Deadline
	OpKill     = "kill"     // event, recorded by whoever killed Proc: it stopped existing at T
	OpServer   = "server"   // event, recorded by an observer: a stored holding (or its end)
)

// Phases of an event.
const (
	Invoke = "invoke"
	Return = "return"
	Point  = "event"
)

// Outcomes.
const (
	OK       = "ok"
	Locked   = "locked"   // ErrLocked: definitely not acquired
	Timeout  = "timeout"  // the wait ran out; the write may or may not have committed
	Lost     = "lost"     // ErrLockLost
	Stale    = "stale"    // the resource refused a stale token
	Failed   = "error"    // anything else; the outcome is unknown
	Canceled = "canceled" // the caller gave up; the outcome is unknown
)

// Event is one line of a history.
type Event struct {
	Proc     string `json:"proc"`
	Op       string `json:"op"`
	Phase    string `json:"phase"`
	ID       int64  `json:"id,omitempty"`
	T        int64  `json:"t"`
	Key      string `json:"key,omitempty"`
	Req      string `json:"req,omitempty"`
	Lease    string `json:"lease,omitempty"`
	Token    int64  `json:"token,omitempty"`
	Outcome  string `json:"outcome,omitempty"`
	Err      string `json:"err,omitempty"`
	Deadline int64  `json:"deadline,omitempty"`
	// Try marks a TryAcquire.
	Try bool `json:"try,omitempty"`
	// Reason is the end reason of a holding an observer saw end.
	Reason string `json:"reason,omitempty"`
	// Shared marks a shared holding (an RWMutex's reader, a Semaphore's
	// permit): on an acquire's invoke, that it asks for one (and Permits is
	// how many the lock admits at once); on its return, and on an observer's
	// event, that the holding is one, on slot Slot. An observer's read lists
	// the ended holdings (Point), then the shared holdings (Return, Shared),
	// then the exclusive holder (Return, with the read's send time in
	// Deadline), all at the read's T.
	Shared  bool  `json:"shared,omitempty"`
	Slot    int32 `json:"slot,omitempty"`
	Permits int   `json:"permits,omitempty"`
}

// Mono is CLOCK_MONOTONIC in nanoseconds: comparable across the processes of one machine.
func Mono() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err)
	}
	return ts.Nano()
}

// MonoAt converts a time of this process's clock to Mono.
func MonoAt(t time.Time) int64 { return Mono() + int64(time.Until(t)) }

// Recorder appends events to a file, one write per line, so a killed process
// leaves every event it recorded.
type Recorder struct {
	mu   sync.Mutex
	f    *os.File
	proc string
	next int64
}

// NewRecorder appends to path for process proc.
func NewRecorder(path, proc string) (*Recorder, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	return &Recorder{f: f, proc: proc}, nil
}

// NextID returns a fresh operation ID.
func (r *Recorder) NextID() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.next++
	return r.next
}

// Record stamps e with the recorder's process name (unless e names another,
// as for a kill the recorder's owner caused) and, if unset, the current time,
// and appends it.
func (r *Recorder) Record(e Event) Event {
	if e.T == 0 {
		e.T = Mono()
	}
	if e.Proc == "" {
		e.Proc = r.proc
	}
	b, err := json.Marshal(e)
	if err != nil {
		panic(err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := r.f.Write(append(b, '\n')); err != nil {
		panic(fmt.Sprintf("history: %v", err))
	}
	return e
}

// Close closes the file.
func (r *Recorder) Close() error { return r.f.Close() }

// ReadFiles reads the events of every file; a torn last line (a process
// killed mid-write) is skipped.
func ReadFiles(paths ...string) ([]Event, error) {
	var out []Event
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var e Event
			if json.Unmarshal(sc.Bytes(), &e) == nil {
				out = append(out, e)
			}
		}
		err = sc.Err()
		_ = f.Close()
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}
