//go:build faults

package faults

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/test/history"
)

// observer reads every watched lock directly from the apiserver (as an admin,
// not through the fault proxy) every 100ms. Each read is a porcupine
// operation (an early expiry shows up as a read of a free lock before its
// holder's safe deadline), and the holders and finished holdings it sees feed
// the request-ID check (I6) and the expiry timings. With several readers
// (an HA control plane's apiservers, each directly) each polls on its own, so
// a stopped apiserver blinds only its own reader.
type observer struct {
	readers []reader
	cancel  context.CancelFunc
	done    chan struct{}

	mu   sync.Mutex
	keys map[string]bool
	seen map[string]bool
	// ended maps a lease to when it was first seen finished, and why.
	ended map[string]endSeen
	// lastHeld maps a lease to the latest send time of a read that saw it held.
	lastHeld map[string]int64
	// reads says, per key, when it was last read and how the last read
	// failed, for a failed spec's message.
	reads map[string]readSeen
}

type readSeen struct {
	ok     int64
	failed int64
	err    error
}

// reader is one of an observer's connections, with a history process of its
// own: one reader's reads of a key are sequential, as a process's are.
type reader struct {
	c   client.Client
	rec *history.Recorder
}

type endSeen struct {
	t      int64
	reason locksv1alpha1.EndReason
	key    string
}

func newObserver() *observer { return newObserverOf("observer", admin) }

// newObserverOf is an observer named name reading through c (a control
// plane of a Describe's own), and through each of more, whose reads are
// recorded as name-1, name-2...
func newObserverOf(name string, c client.Client, more ...client.Client) *observer {
	ctx, cancel := context.WithCancel(context.Background())
	o := &observer{cancel: cancel, done: make(chan struct{}), keys: map[string]bool{}, seen: map[string]bool{},
		ended: map[string]endSeen{}, lastHeld: map[string]int64{}, reads: map[string]readSeen{}}
	for i, c := range append([]client.Client{c}, more...) {
		proc := name
		if i > 0 {
			proc = fmt.Sprintf("%s-%d", name, i)
		}
		path := filepath.Join(workDir, "history", proc+".jsonl")
		rec, err := history.NewRecorder(path, proc)
		must(err)
		histories = append(histories, path)
		o.readers = append(o.readers, reader{c: c, rec: rec})
	}
	go o.run(ctx)
	return o
}

func (o *observer) watch(key string)   { o.mu.Lock(); o.keys[key] = true; o.mu.Unlock() }
func (o *observer) unwatch(key string) { o.mu.Lock(); delete(o.keys, key); o.mu.Unlock() }

func (o *observer) stop() { o.cancel(); <-o.done }

func (o *observer) run(ctx context.Context) {
	defer close(o.done)
	var wg sync.WaitGroup
	for _, r := range o.readers {
		wg.Go(func() { o.poll(ctx, r) })
	}
	wg.Wait()
}

// poll reads every watched key through r every 100ms.
func (o *observer) poll(ctx context.Context, r reader) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		o.mu.Lock()
		keys := make([]string, 0, len(o.keys))
		for k := range o.keys {
			keys = append(keys, k)
		}
		o.mu.Unlock()
		var wg sync.WaitGroup
		for _, k := range keys {
			wg.Go(func() { o.read(ctx, r, k) })
		}
		wg.Wait()
	}
}

func (o *observer) read(ctx context.Context, r reader, key string) {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	sent := history.Mono()
	l := &locksv1alpha1.DistributedLock{}
	err := r.c.Get(rctx, client.ObjectKey{Namespace: namespace, Name: key}, l)
	o.mu.Lock()
	defer o.mu.Unlock()
	// Answered by now, and timed under the lock: an ended holding is recorded
	// only by the first read to show it, so the reads' times must follow the
	// order they take the lock in. Timed before it, a read that waited for the
	// lock could be recorded as first showing the holder, while the ended
	// holding before it was recorded by a read that took the lock first but is
	// timed later.
	now := history.Mono()
	rs := o.reads[key]
	if err != nil {
		rs.failed, rs.err = now, err
		o.reads[key] = rs
		return
	}
	rs.ok = now
	o.reads[key] = rs
	s := l.Status
	e := history.Event{Op: history.OpServer, Phase: history.Return, Key: key, Token: s.FencingToken, Deadline: sent, T: now}
	if h := s.Holder; h != nil {
		e.Lease, e.Req = h.LeaseID, h.RequestID
		o.lastHeld[h.LeaseID] = max(o.lastHeld[h.LeaseID], sent)
	}
	r.rec.Record(e)
	for _, f := range s.RecentAcquisitions {
		if o.seen[f.LeaseID] {
			continue
		}
		o.seen[f.LeaseID] = true
		o.ended[f.LeaseID] = endSeen{t: now, reason: f.EndReason, key: key}
		r.rec.Record(history.Event{Op: history.OpServer, Phase: history.Point, Key: key, Lease: f.LeaseID, Req: f.RequestID, Token: f.FencingToken, Reason: string(f.EndReason), Err: f.EndedBy, T: now})
	}
}

// expiries returns the holdings of key prefix seen ended by expiry (their
// lease's, or their session's), with when they were first seen ended and the
// send time of the last read that still saw them held.
func (o *observer) expiries(prefix string) map[string][2]int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[string][2]int64{}
	for lease, e := range o.ended {
		expired := e.reason == locksv1alpha1.EndReasonExpired || e.reason == locksv1alpha1.EndReasonSessionExpired
		if expired && hasPrefix(e.key, prefix) {
			out[lease] = [2]int64{e.t, o.lastHeld[lease]}
		}
	}
	return out
}

// seenOf describes what the observer saw of keys and leases, for a failed
// spec's message: each key's last read (or failure) and how each lease ended.
func (o *observer) seenOf(keys, leases []string) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := history.Mono()
	var b strings.Builder
	for _, k := range keys {
		rs := o.reads[k]
		fmt.Fprintf(&b, "\n  key %s: watched %t, last read %s ago", k, o.keys[k], ago(now, rs.ok))
		if rs.err != nil {
			fmt.Fprintf(&b, ", last failure %s ago: %v", ago(now, rs.failed), rs.err)
		}
	}
	for _, lease := range leases {
		e, ok := o.ended[lease]
		if !ok {
			fmt.Fprintf(&b, "\n  lease %s: not seen ended, last seen held %s ago", lease, ago(now, o.lastHeld[lease]))
			continue
		}
		fmt.Fprintf(&b, "\n  lease %s: seen ended %s (%s) %s ago", lease, e.reason, e.key, ago(now, e.t))
	}
	return b.String()
}

func ago(now, t int64) string {
	if t == 0 {
		return "never"
	}
	return time.Duration(now - t).Round(time.Millisecond).String()
}

// keysOf returns the keys of prefix the observer ever read or tried to.
func (o *observer) keysOf(prefix string) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []string
	for k := range o.reads {
		if hasPrefix(k, prefix) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}
