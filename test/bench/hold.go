package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/rest"

	"github.com/kubelock/kubelock/pkg/lock"
)

// --- workload 5: holding only ----------------------------------------------------

// holdConfig: N clients each hold perClient locks and keep them, nothing
// else; without sessions every lock is renewed every lease/3, in a session
// the client renews its one session every TTL/3 (TTL = lease) instead.
type holdConfig struct {
	clients   int
	perClient int
	lease     time.Duration
	measure   time.Duration
}

type holdResult struct {
	System   string
	Sessions bool
	Clients  int
	Held     int
	// LockWrites: the clients' own writes/s in the window (renewals of
	// locks, or of sessions); APIWrites: the apiserver's writes of the
	// system's own resources (Resources); APIByKind: all its writes, the
	// operator's leader-election Lease among them.
	LockWrites float64
	APIWrites  float64
	APIByKind  writeCounts
	Resources  []string
	APICPU     float64 // kube-apiserver CPU seconds per second
	Renew      dist
	Errors     int
	ErrKinds   map[string]int
}

func (h *holdResult) perHeld(v float64) float64 { return v / float64(max(1, h.Held)) }

// holdTarget is one system's way to take a lock for client i.
type holdTarget struct {
	acquire func(ctx context.Context, client int, key string) (holding, error)
	// sessionRenewals is set when the locks are in sessions: the library
	// renews them, and their latency is timed on the wire.
	sessionRenewals *wireTimer
	// resources are the API resources whose writes the system causes.
	resources []string
	close     func(ctx context.Context)
}

// runHold takes clients × perClient locks from free, keeps them for the
// window and gives them back.
func runHold(ctx context.Context, c *cluster, pw *procWatch, name string, sessions bool, free pool, cfg holdConfig, t holdTarget) *holdResult {
	res := &holdResult{System: name, Sessions: sessions, Clients: cfg.clients, ErrKinds: map[string]int{}, Resources: t.resources}
	if t.close != nil {
		defer t.close(context.WithoutCancel(ctx))
	}
	type held struct {
		idx int
		h   holding
	}
	var mu sync.Mutex
	var locks []held
	jobs := make(chan int)
	var wg sync.WaitGroup
	var failed atomic.Int64
	var firstErr string
	for range 32 {
		wg.Go(func() {
			for client := range jobs {
				idx, ok := free.take()
				if !ok {
					failed.Add(1)
					continue
				}
				h, err := t.acquire(ctx, client, lockName(idx))
				if err != nil {
					free <- idx
					failed.Add(1)
					mu.Lock()
					if firstErr == "" {
						firstErr = errKind(err)
					}
					mu.Unlock()
					continue
				}
				mu.Lock()
				locks = append(locks, held{idx, h})
				mu.Unlock()
			}
		})
	}
	for i := range cfg.clients * cfg.perClient {
		jobs <- i % cfg.clients
	}
	close(jobs)
	wg.Wait()
	defer parallel(locks, func(hl held) {
		_ = hl.h.release(context.WithoutCancel(ctx))
		free <- hl.idx
	})
	res.Held = len(locks)
	if f := failed.Load(); f > 0 {
		res.Errors += int(f)
		res.ErrKinds["acquiring the held population: "+firstErr] += int(f)
	}

	renewEvery := cfg.lease / 3
	// Let acquisitions and the operator's follow-up (a session's lock count)
	// settle, then measure one window of at least a whole renewal period.
	settle := 2 * time.Second
	ws := time.Now().Add(settle)
	we := ws.Add(cfg.measure)
	win := newRecorder(ws, we)
	stop := make(chan struct{})
	var renewers sync.WaitGroup
	if t.sessionRenewals != nil {
		t.sessionRenewals.set(win)
	} else {
		for _, hl := range locks {
			renewers.Go(func() {
				next := time.Now().Add(time.Duration(rand.Int64N(int64(renewEvery))))
				for {
					tm := time.NewTimer(time.Until(next))
					select {
					case <-stop:
						tm.Stop()
						return
					case <-tm.C:
					}
					win.begin(next)(hl.h.renew(ctx))
					next = next.Add(renewEvery)
				}
			})
		}
	}
	time.Sleep(time.Until(ws))
	w0, _ := c.apiserverWrites(ctx)
	cpu0 := pw.snap()
	time.Sleep(time.Until(we))
	w1, _ := c.apiserverWrites(ctx)
	cpu1 := pw.snap()
	// Renewals begun in the window may still be running.
	win.drain(min(5*time.Second, renewEvery))
	close(stop)
	renewers.Wait()
	if t.sessionRenewals != nil {
		t.sessionRenewals.set(nil)
	}
	secs := cfg.measure.Seconds()
	res.APIByKind = w1.since(w0, secs)
	res.APIWrites = res.APIByKind.of(t.resources...)
	res.APICPU = cpu1.since(cpu0)["kube-apiserver"] / secs
	lat, errs, kinds := win.snapshot()
	res.Renew = summarize(lat)
	res.LockWrites = float64(len(lat)+errs) / secs
	res.Errors += errs
	for k, v := range kinds {
		res.ErrKinds[k] += v
	}
	return res
}

// kubelockHold: clients of pkg/lock (in the given encoding), each with its
// own session when sessions is set.
func kubelockHold(ctx context.Context, newClient lockClientFactory, cfg *rest.Config, ns string, hc holdConfig, sessions bool) (holdTarget, error) {
	// Events: the operator's, should it write any while locks are only held.
	t := holdTarget{resources: []string{"distributedlocks", "locksessions", "events"}}
	if sessions {
		t.sessionRenewals = &wireTimer{}
		cfg = t.sessionRenewals.wrap(cfg)
	}
	clients := make([]*lock.Client, hc.clients)
	var ss []*lock.Session
	t.close = func(ctx context.Context) {
		for _, s := range ss {
			_ = s.Close(ctx)
		}
	}
	for i := range hc.clients {
		c, err := newClient(cfg, lock.WithNamespace(ns), lock.WithIdentity(fmt.Sprintf("holder-%d", i)), lock.WithoutAutoRenew(), lock.WithLeaseDuration(hc.lease))
		if err != nil {
			t.close(ctx)
			return t, err
		}
		clients[i] = c
		if sessions {
			s, err := c.NewSession(ctx, lock.WithTTL(hc.lease))
			if err != nil {
				t.close(ctx)
				return t, err
			}
			ss = append(ss, s)
		}
	}
	t.acquire = func(ctx context.Context, i int, key string) (holding, error) {
		var opts []lock.AcquireOption
		if sessions {
			opts = append(opts, lock.WithSession(ss[i]))
		}
		l, err := clients[i].TryAcquire(ctx, key, opts...)
		if err != nil {
			return nil, err
		}
		return kubelockHolding{l}, nil
	}
	return t, nil
}

// leaseHold: raw Leases, renewed by the benchmark like unsessioned locks.
func leaseHold(ll *leaseLocker) holdTarget {
	return holdTarget{resources: []string{"leases"},
		acquire: func(ctx context.Context, _ int, key string) (holding, error) { return ll.acquire(ctx, key) }}
}

// wireTimer times the session renewals a client library sends by itself
// (PATCH locksessions/<name>/status), from the request's start to its
// answer, into the recorder set (none: not recorded).
type wireTimer struct {
	cur atomic.Pointer[recorder]
}

func (w *wireTimer) set(r *recorder) { w.cur.Store(r) }

func (w *wireTimer) wrap(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if req.Method != http.MethodPatch || !strings.Contains(req.URL.Path, "/locksessions/") || !strings.HasSuffix(req.URL.Path, "/status") {
				return rt.RoundTrip(req)
			}
			done := w.cur.Load().begin(time.Now()) // a nil recorder records nothing
			resp, err := rt.RoundTrip(req)
			if err == nil && resp.StatusCode >= 300 {
				done(fmt.Errorf("session renewal: HTTP %d", resp.StatusCode))
			} else {
				done(err)
			}
			return resp, err
		})
	})
	return cfg
}

func logHold(r *holdResult) {
	logf("  %-26s hold only (%s): %d clients, %d held, client writes/s %.1f (%.4f per held lock), apiserver writes/s %.1f (%.4f per held lock; %s), renew p50 %v p99 %v (n=%d), errors %d%s",
		r.System, sessionWord(r.Sessions), r.Clients, r.Held, r.LockWrites, r.perHeld(r.LockWrites), r.APIWrites, r.perHeld(r.APIWrites), r.APIByKind,
		r.Renew.P50.Round(100*time.Microsecond), r.Renew.P99.Round(100*time.Microsecond), r.Renew.N, r.Errors, firstKind(r.ErrKinds))
}

func sessionWord(s bool) string {
	if s {
		return "sessions"
	}
	return "no sessions"
}
