//go:build faults

// Package wire is the line protocol between the fault-injection suite and its
// client processes (test/e2e/faults/client): one JSON Command per input line,
// one JSON Reply per output line.
package wire

import "time"

// Command is one line of input.
type Command struct {
	ID  int64  `json:"id"`
	Cmd string `json:"cmd"` // session, acquire, release, write, loop, stop, cancel, exit, seed-capacity, seed, seed-stop
	Key string `json:"key,omitempty"`
	Req string `json:"req,omitempty"`
	Try bool   `json:"try,omitempty"`
	// InSession acquires in the client's session (made by a session command).
	InSession bool `json:"inSession,omitempty"`
	// TTL is the TTL of the session a session command creates.
	TTL time.Duration `json:"ttl,omitempty"`
	// Wait bounds an acquire (its WithWaitTimeout, and its context).
	Wait time.Duration `json:"wait,omitempty"`
	// Lease asks for a lease other than the lock's default.
	Lease time.Duration `json:"lease,omitempty"`
	// N is the number of writes (write), or per holding (loop).
	N int `json:"n,omitempty"`
	// Every spaces writes (write, loop).
	Every time.Duration `json:"every,omitempty"`
	// Keys are the keys a loop picks from; Seed seeds its choices.
	Keys []string `json:"keys,omitempty"`
	Seed uint64   `json:"seed,omitempty"`
	// Target is the command ID cancel cancels.
	Target int64 `json:"target,omitempty"`
	// Rate is the lock writes/s a seed command offers (acquire, renew and
	// release one third each); Hold is how long its churn holds a lock.
	Rate float64       `json:"rate,omitempty"`
	Hold time.Duration `json:"hold,omitempty"`
	// Warmup and For are a seed-capacity step's unmeasured and measured time.
	Warmup time.Duration `json:"warmup,omitempty"`
	For    time.Duration `json:"for,omitempty"`
}

// Reply answers a command.
type Reply struct {
	ID       int64  `json:"id"`
	Outcome  string `json:"outcome"`
	Err      string `json:"err,omitempty"`
	Lease    string `json:"lease,omitempty"`
	Req      string `json:"req,omitempty"`
	Token    int64  `json:"token,omitempty"`
	Accepted int    `json:"accepted,omitempty"`
	Stale    int    `json:"stale,omitempty"`
	Ops      int64  `json:"ops,omitempty"`
	// Session is the name of the session a session command created.
	Session string `json:"session,omitempty"`
	// Errors counts a seed-capacity step's failed lock writes; Lost a seed
	// run's holdings lost while renewed.
	Errors int `json:"errors,omitempty"`
	Lost   int `json:"lost,omitempty"`
	// Samples are a seed run's timed operations.
	Samples []Sample `json:"samples,omitempty"`
}

// Sample is one timed lock operation of a seed run: Op (acquire, renew or
// release) scheduled at T (CLOCK_MONOTONIC, as histories record) took Lat
// nanoseconds from then, or failed with Err.
type Sample struct {
	Op  string `json:"op"`
	T   int64  `json:"t"`
	Lat int64  `json:"lat"`
	Err string `json:"err,omitempty"`
}
