//go:build faults

// Command client is the fault-injection suite's lock client: a separate process
// on pkg/lock that the suite can pause and kill. It reads commands as JSON
// lines on stdin, answers each on stdout, and records every operation it
// invokes and every answer, loss and safe deadline it sees in a history file
// (test/history), with writes to a PostgreSQL table guarded by pkg/fencing.
// In session mode (a session command, then acquires with inSession) its locks
// are held in one LockSession: each lock's safe deadline is the session's, and
// each lock's loss is recorded, so I5 is checked per lock of the session.
// The seed commands run the seed mix at a given rate and answer each
// operation's latency (seed_mix.go).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/kubelock/kubelock/test/e2e/faults/wire"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kubelock/kubelock/pkg/fencing"
	"github.com/kubelock/kubelock/pkg/fencing/postgres"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/history"
)

type proc struct {
	name string
	cfg  *rest.Config
	rec  *history.Recorder
	lc   *lock.Client
	db   *pgxpool.Pool
	g    *postgres.Guard

	outMu sync.Mutex
	out   *bufio.Writer

	mu sync.Mutex
	// session is the client's one session (the session command), nil before.
	session *lock.Session
	held    map[string]*lock.Lock
	cancels map[int64]context.CancelFunc
	loops   []func() int64
	seq     int64
	// seed is the seed mix under way (seed, seed-stop), nil before.
	seed *seedMix
}

func main() {
	var (
		server    = flag.String("server", "", "apiserver URL (the fault proxy)")
		kubecfg   = flag.String("kubeconfig", "", "kubeconfig to reach the apiserver by instead of --server (straight, not through the fault proxy)")
		name      = flag.String("name", "", "process name: identity, user agent and history proc")
		namespace = flag.String("namespace", "default", "namespace of the locks")
		histPath  = flag.String("history", "", "history file")
		dsn       = flag.String("pg", "", "PostgreSQL DSN of the protected resource")
	)
	flag.Parse()
	cfg := &rest.Config{Host: *server}
	if *kubecfg != "" {
		var err error
		if cfg, err = clientcmd.BuildConfigFromFlags("", *kubecfg); err != nil {
			fmt.Fprintln(os.Stderr, "client:", err)
			os.Exit(1)
		}
	}
	cfg.UserAgent, cfg.QPS = *name, -1
	if err := run(cfg, *name, *namespace, *histPath, *dsn); err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		os.Exit(1)
	}
}

func run(cfg *rest.Config, name, namespace, histPath, dsn string) error {
	rec, err := history.NewRecorder(histPath, name)
	if err != nil {
		return err
	}
	lc, err := lock.New(cfg, lock.WithNamespace(namespace), lock.WithIdentity(name))
	if err != nil {
		return err
	}
	ctx := context.Background()
	db, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	p := &proc{name: name, cfg: cfg, rec: rec, lc: lc, db: db, g: postgres.NewGuard(db), out: bufio.NewWriter(os.Stdout),
		held: map[string]*lock.Lock{}, cancels: map[int64]context.CancelFunc{}}
	if _, err := lc.User(ctx); err != nil { // learn the user once, before any fault
		return err
	}
	p.reply(wire.Reply{ID: 0, Outcome: "ready"})
	sc := bufio.NewScanner(os.Stdin)
	var wg sync.WaitGroup
	for sc.Scan() {
		var c wire.Command
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			return err
		}
		if c.Cmd == "exit" {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.reply(p.do(c))
		}()
	}
	p.mu.Lock()
	for _, l := range p.held {
		_ = l.Release(ctx)
	}
	s := p.session
	p.mu.Unlock()
	if s != nil {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		_ = s.Close(cctx)
	}
	return nil
}

func (p *proc) reply(r wire.Reply) {
	b, _ := json.Marshal(r)
	p.outMu.Lock()
	defer p.outMu.Unlock()
	_, _ = p.out.Write(append(b, '\n'))
	_ = p.out.Flush()
}

func (p *proc) do(c wire.Command) wire.Reply {
	switch c.Cmd {
	case "session":
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		s, err := p.lc.NewSession(ctx, lock.WithTTL(c.TTL))
		if err != nil {
			return wire.Reply{ID: c.ID, Outcome: outcome(err), Err: err.Error()}
		}
		p.mu.Lock()
		p.session = s
		p.mu.Unlock()
		return wire.Reply{ID: c.ID, Outcome: history.OK, Session: s.Name()}
	case "acquire":
		ctx, cancel := context.WithCancel(context.Background())
		p.mu.Lock()
		p.cancels[c.ID] = cancel
		p.mu.Unlock()
		defer func() {
			p.mu.Lock()
			delete(p.cancels, c.ID)
			p.mu.Unlock()
			cancel()
		}()
		_, r := p.acquire(ctx, c)
		r.ID = c.ID
		return r
	case "release":
		return p.release(c)
	case "write":
		acc, stale := p.writes(c.Key, c.N, c.Every, false)
		return wire.Reply{ID: c.ID, Outcome: history.OK, Accepted: acc, Stale: stale}
	case "cancel":
		p.mu.Lock()
		cancel := p.cancels[c.Target]
		p.mu.Unlock()
		if cancel == nil {
			return wire.Reply{ID: c.ID, Outcome: history.Failed, Err: "no such command in flight"}
		}
		cancel()
		return wire.Reply{ID: c.ID, Outcome: history.OK}
	case "loop":
		return p.loop(c)
	case "stop":
		p.mu.Lock()
		loops := p.loops
		p.loops = nil
		p.mu.Unlock()
		var n int64
		for _, stop := range loops {
			n += stop()
		}
		return wire.Reply{ID: c.ID, Outcome: history.OK, Ops: n}
	case "seed-capacity":
		return p.seedCapacity(c)
	case "seed":
		return p.startSeed(c)
	case "seed-stop":
		return p.stopSeed(c)
	}
	return wire.Reply{ID: c.ID, Outcome: history.Failed, Err: "unknown command " + c.Cmd}
}

func outcome(err error) string {
	switch {
	case err == nil:
		return history.OK
	case errors.Is(err, lock.ErrLocked):
		return history.Locked
	case errors.Is(err, lock.ErrLockLost):
		return history.Lost
	case errors.Is(err, lock.ErrTimeout):
		return history.Timeout
	case errors.Is(err, context.Canceled):
		return history.Canceled
	}
	return history.Failed
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// acquire runs one Acquire or TryAcquire and records it; a holding is watched
// for its safe deadline and its loss until it ends.
func (p *proc) acquire(ctx context.Context, c wire.Command) (*lock.Lock, wire.Reply) {
	l, r := p.take(ctx, p.lc, c)
	if l == nil {
		return nil, r
	}
	p.mu.Lock()
	p.held[c.Key] = l
	p.mu.Unlock()
	go p.watch(l)
	return l, r
}

// take runs one Acquire or TryAcquire with lc and records it, and nothing more.
func (p *proc) take(ctx context.Context, lc *lock.Client, c wire.Command) (*lock.Lock, wire.Reply) {
	req := c.Req
	if req == "" {
		req = fmt.Sprintf("%s-%d-%d", p.name, time.Now().UnixNano(), rand.Uint64())
	}
	var opts []lock.AcquireOption
	opts = append(opts, lock.WithRequestID(req))
	if c.Lease > 0 {
		opts = append(opts, lock.WithLeaseDuration(c.Lease))
	}
	if c.InSession {
		p.mu.Lock()
		opts = append(opts, lock.WithSession(p.session))
		p.mu.Unlock()
	}
	wait := c.Wait
	if wait <= 0 {
		wait = 30 * time.Second
	}
	id := p.rec.NextID()
	p.rec.Record(history.Event{Op: history.OpAcquire, Phase: history.Invoke, ID: id, Key: c.Key, Req: req, Try: c.Try})
	var (
		l   *lock.Lock
		err error
	)
	if c.Try {
		tctx, cancel := context.WithTimeout(ctx, wait)
		l, err = lc.TryAcquire(tctx, c.Key, opts...)
		cancel()
	} else {
		l, err = lc.Acquire(ctx, c.Key, append(opts, lock.WithWaitTimeout(wait))...)
	}
	e := history.Event{Op: history.OpAcquire, Phase: history.Return, ID: id, Key: c.Key, Req: req, Outcome: outcome(err), Err: errText(err)}
	if err == nil {
		e.Lease, e.Token, e.Deadline = l.LeaseID(), l.FencingToken(), history.MonoAt(l.ExpiresAt())
	}
	p.rec.Record(e)
	if err != nil {
		return nil, wire.Reply{Outcome: e.Outcome, Err: e.Err, Req: req}
	}
	return l, wire.Reply{Outcome: history.OK, Lease: l.LeaseID(), Token: l.FencingToken(), Req: req}
}

// ended records the loss of l, whose Done fired, and forgets it.
func (p *proc) ended(l *lock.Lock) {
	if err := l.Err(); errors.Is(err, lock.ErrLockLost) {
		p.rec.Record(history.Event{Op: history.OpLost, Phase: history.Point, Key: l.Key(), Lease: l.LeaseID(), Token: l.FencingToken(), Outcome: history.Lost, Err: err.Error(), Deadline: history.MonoAt(l.ExpiresAt())})
	}
	p.mu.Lock()
	if p.held[l.Key()] == l {
		delete(p.held, l.Key())
	}
	p.mu.Unlock()
}

// watch records every extension of the safe deadline, and the loss.
func (p *proc) watch(l *lock.Lock) {
	last := l.ExpiresAt()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-l.Done():
			p.ended(l)
			return
		case <-t.C:
			if d := l.ExpiresAt(); d.After(last) {
				last = d
				p.rec.Record(history.Event{Op: history.OpDeadline, Phase: history.Point, Key: l.Key(), Lease: l.LeaseID(), Deadline: history.MonoAt(d)})
			}
		}
	}
}

func (p *proc) release(c wire.Command) wire.Reply {
	p.mu.Lock()
	l := p.held[c.Key]
	p.mu.Unlock()
	if l == nil {
		return wire.Reply{ID: c.ID, Outcome: history.Failed, Err: "not held: " + c.Key}
	}
	err := p.releaseLock(l)
	return wire.Reply{ID: c.ID, Outcome: outcome(err), Err: errText(err), Lease: l.LeaseID()}
}

func (p *proc) releaseLock(l *lock.Lock) error {
	id := p.rec.NextID()
	p.rec.Record(history.Event{Op: history.OpRelease, Phase: history.Invoke, ID: id, Key: l.Key(), Lease: l.LeaseID(), Token: l.FencingToken()})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	err := l.Release(ctx)
	cancel()
	p.rec.Record(history.Event{Op: history.OpRelease, Phase: history.Return, ID: id, Key: l.Key(), Lease: l.LeaseID(), Outcome: outcome(err), Err: errText(err)})
	p.mu.Lock()
	if p.held[l.Key()] == l {
		delete(p.held, l.Key())
	}
	p.mu.Unlock()
	return err
}

// writes makes n fenced writes with the token of the holding of key. With
// check, it stops once the holding is lost; without, it writes blindly, as a
// process paused between its check and its write would.
func (p *proc) writes(key string, n int, every time.Duration, check bool) (accepted, stale int) {
	p.mu.Lock()
	l := p.held[key]
	p.mu.Unlock()
	if l == nil {
		return 0, 0
	}
	for i := 0; i < n; i++ {
		if i > 0 && every > 0 {
			time.Sleep(every) // pacing of the workload, not synchronisation
		}
		if check && l.Err() != nil {
			return accepted, stale
		}
		switch p.write(l) {
		case history.OK:
			accepted++
		case history.Stale:
			stale++
		}
	}
	return accepted, stale
}

func (p *proc) write(l *lock.Lock) string {
	p.mu.Lock()
	p.seq++
	seq := p.seq
	p.mu.Unlock()
	id := p.rec.NextID()
	p.rec.Record(history.Event{Op: history.OpWrite, Phase: history.Invoke, ID: id, Key: l.Key(), Lease: l.LeaseID(), Token: l.FencingToken()})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := p.g.Do(ctx, l.Key(), l.FencingToken(), func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO faults_writes (lock_key, token, proc, seq, t) VALUES ($1, $2, $3, $4, $5)`, l.Key(), l.FencingToken(), p.name, seq, history.Mono())
		return err
	})
	o := history.OK
	switch {
	case errors.Is(err, fencing.ErrStaleToken):
		o = history.Stale
	case err != nil:
		o = history.Failed
	}
	p.rec.Record(history.Event{Op: history.OpWrite, Phase: history.Return, ID: id, Key: l.Key(), Lease: l.LeaseID(), Token: l.FencingToken(), Outcome: o, Err: errText(err)})
	return o
}

// loop runs a workload in the background until stop: pick a key, acquire it
// (a TryAcquire one time in four), make N checked writes, release.
func (p *proc) loop(c wire.Command) wire.Reply {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var ops int64
	rng := rand.New(rand.NewPCG(c.Seed, 0x6661756c7473))
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			key := c.Keys[rng.IntN(len(c.Keys))]
			try := rng.IntN(4) == 0
			l, r := p.acquire(ctx, wire.Command{Key: key, Try: try, Wait: c.Wait, Lease: c.Lease, InSession: c.InSession})
			ops++
			if r.Outcome != history.OK {
				if r.Outcome != history.Locked {
					// the control plane is failing: back off a little (pacing, not synchronisation)
					select {
					case <-ctx.Done():
					case <-time.After(100 * time.Millisecond):
					}
				}
				continue
			}
			a, s := p.writes(key, c.N, c.Every, true)
			ops += int64(a + s)
			if l.Err() == nil {
				_ = p.releaseLock(l)
				ops++
			}
		}
	}()
	p.mu.Lock()
	p.loops = append(p.loops, func() int64 { cancel(); <-done; return ops })
	p.mu.Unlock()
	return wire.Reply{ID: c.ID, Outcome: history.OK}
}
