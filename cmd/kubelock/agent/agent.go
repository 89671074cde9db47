// Package agent is kubelock's pod-local lock service: an HTTP server on
// 127.0.0.1 that takes locks on demand for the app beside it, so that a
// program in any language holds a lock per order, file or tenant with a curl
// line. Every holding lives in the agent's one LockSession; pkg/lock does all
// the protocol work.
//
// It serves two APIs on one port: its own small JSON API under /v1/locks
// (acquire by key, try or wait; a lease the app renews; shared mode; release;
// get, and a long poll that returns when a holding ends), and Dapr's
// distributed lock API (/v1.0-alpha1/lock and /unlock, with the health and
// metadata endpoints Dapr's SDKs call on start), unchanged but for the
// fencing token added to the lock response.
//
// A holding's lease is the app's: the agent releases a holding the app did
// not renew within it (Dapr's expiryInSeconds, never renewed). The session's
// TTL is the agent's own liveness: if the agent stops renewing, the
// controller ends every holding after the TTL, and a pod-bound session's
// locks are freed as soon as the pod is deleted.
package agent

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/lru"

	"github.com/kubelock/kubelock/internal/escape"
	"github.com/kubelock/kubelock/pkg/lock"
)

// Defaults of Options.
const (
	// DefaultLease is a holding's lease when the acquire names none.
	DefaultLease = 30 * time.Second
	// DefaultDaprStore is the lock store name Dapr's API answers to.
	DefaultDaprStore = "lockstore"
	// DefaultMaxLocks bounds the holdings and waiting acquires at once.
	DefaultMaxLocks = 1024
)

// endedLimit is how many ended holdings the agent remembers, to tell the app
// why one is over (released, expired or lost) rather than only that it is.
const endedLimit = 1024

// How a holding ended (Reason in the API's answers).
const (
	endReleased = "released" // the app released it
	endExpired  = "expired"  // the app did not renew it within its lease
	endLost     = "lost"     // pkg/lock lost it: expired or force-released on the server, or the session ended
)

// Options configure an Agent.
type Options struct {
	// SessionTTL is the TTL of the agent's LockSession (whole seconds,
	// 5s..1h): how long its holdings outlive the agent's last renewal.
	SessionTTL time.Duration
	// Lease is the lease of a holding whose acquire names none
	// (DefaultLease when zero).
	Lease time.Duration
	// DaprStores are the lock store names Dapr's API answers to
	// (DefaultDaprStore when empty).
	DaprStores []string
	// MaxLocks bounds the holdings and waiting acquires at once
	// (DefaultMaxLocks when zero).
	MaxLocks int
	// Fatal reports a failure to open the session that retrying cannot
	// mend (missing RBAC, say): Run returns it. Nil retries every failure.
	Fatal func(error) bool
	// Logf logs one line; nil logs nothing.
	Logf func(format string, args ...any)
	// Version is the agent's version, shown in Dapr's metadata.
	Version string
}

// Agent takes locks for the app beside it, in one session.
type Agent struct {
	c *lock.Client
	o Options

	// smu serialises opening sessions; session is the current one.
	smu     sync.Mutex
	session *lock.Session

	mu      sync.Mutex
	held    map[string]*holding // live holdings by lease ID
	pending int                 // acquires under way
	closed  bool
	ended   *lru.Cache // lease ID → *holding, the last endedLimit to end
}

// New returns an agent that takes locks with c. Start its session with Run.
func New(c *lock.Client, o Options) *Agent {
	if o.Lease == 0 {
		o.Lease = DefaultLease
	}
	if len(o.DaprStores) == 0 {
		o.DaprStores = []string{DefaultDaprStore}
	}
	if o.MaxLocks == 0 {
		o.MaxLocks = DefaultMaxLocks
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	return &Agent{c: c, o: o, held: map[string]*holding{}, ended: lru.New(endedLimit)}
}

// holding is one lock the agent holds for the app.
type holding struct {
	l       *lock.Lock
	key     string
	owner   string // Dapr's lockOwner; empty for the agent's own API
	lease   time.Duration
	session string

	mu       sync.Mutex
	leaseEnd time.Time // the agent releases it then, unless the app renews it
	timer    *time.Timer
	ending   string // endReleased or endExpired once the agent ends it
}

// state says whether h is live and, when not, why it ended (with pkg/lock's
// cause when it was lost).
func (h *holding) state() (live bool, reason string, cause error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	err := h.l.Err()
	switch {
	case err != nil && !errors.Is(err, lock.ErrReleased):
		return false, endLost, err
	case h.ending != "":
		return false, h.ending, nil
	}
	return err == nil, "", nil
}

// claimEnd marks h as ending for why; false when it was ending already or
// is over.
func (h *holding) claimEnd(why string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.claimLocked(why)
}

// claimExpiry marks h as expiring when its lease has passed unrenewed;
// false when it was renewed, or is ending or over. The check and the mark
// are one step, so that a renewal the app was told of is never expired.
func (h *holding) claimExpiry() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !time.Now().Before(h.leaseEnd) && h.claimLocked(endExpired)
}

// claimLocked is claimEnd with h.mu held.
func (h *holding) claimLocked(why string) bool {
	if h.endingLocked() {
		return false
	}
	h.ending = why
	h.timer.Stop()
	return true
}

// endingLocked reports, with h.mu held, whether h is ending or over.
func (h *holding) endingLocked() bool { return h.ending != "" || h.l.Err() != nil }

// renew moves the end of h's lease to a lease from now; false when h is
// over or ending.
func (h *holding) renew() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.endingLocked() {
		return false
	}
	h.leaseEnd = time.Now().Add(h.lease)
	h.timer.Reset(h.lease)
	return true
}

// deadline is the safe deadline of h: the end of its lease or the session's
// safe deadline, whichever comes first.
func (h *holding) deadline() time.Time {
	h.mu.Lock()
	end := h.leaseEnd
	h.mu.Unlock()
	if d := h.l.ExpiresAt(); d.Before(end) {
		return d
	}
	return end
}

// Run keeps a session open until ctx ends: it opens one at once and again
// whenever one ends, retrying failures with back-off (1s doubling to 30s).
// It returns nil when ctx ends, or a failure Options.Fatal calls fatal.
func (a *Agent) Run(ctx context.Context) error {
	back := sessionBackoff()
	for {
		s, err := a.liveSession(ctx)
		select {
		case <-ctx.Done(): // stopping: a failure now is the cancellation's
			return nil
		default:
		}
		switch {
		case err != nil && a.o.Fatal != nil && a.o.Fatal(err):
			return err
		case err != nil:
			d := back.Step()
			a.logf("opening a session failed, retrying in %s: %v", d, err)
			select {
			case <-ctx.Done():
			case <-time.After(d):
			}
			continue
		}
		back = sessionBackoff()
		select {
		case <-ctx.Done():
			return nil
		case <-s.Done():
		}
	}
}

func sessionBackoff() wait.Backoff {
	return wait.Backoff{Duration: time.Second, Factor: 2, Steps: 1 << 30, Cap: 30 * time.Second}
}

// Ready reports whether the agent has a live session to take locks in.
func (a *Agent) Ready() bool {
	a.smu.Lock()
	defer a.smu.Unlock()
	return a.session != nil && a.session.Err() == nil
}

// liveSession is the current session, or a new one when there is none or it
// ended (its locks ended with it).
func (a *Agent) liveSession(ctx context.Context) (*lock.Session, error) {
	a.smu.Lock()
	defer a.smu.Unlock()
	if s := a.session; s != nil && s.Err() == nil {
		return s, nil
	}
	if old := a.session; old != nil {
		go a.closeSession(old) // it ended: make sure nothing waits for it to lapse
	}
	s, err := a.c.NewSession(ctx, lock.WithTTL(a.o.SessionTTL))
	if err != nil {
		return nil, err
	}
	a.session = s
	a.logf("session %s/%s open (TTL %s)", a.c.Namespace(), s.Name(), s.TTL())
	context.AfterFunc(s.Context(), func() {
		if err := s.Err(); !errors.Is(err, lock.ErrSessionClosed) {
			a.logf("session %s ended, and every lock held in it: %v", s.Name(), err)
		}
	})
	return s, nil
}

func (a *Agent) closeSession(s *lock.Session) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Close(ctx); err != nil {
		a.logf("%v; the session lapses after its TTL", err)
	}
}

// errStopping refuses acquires once the agent is stopping.
var errStopping = errors.New("kubelock agent: stopping")

// errTooMany refuses an acquire beyond Options.MaxLocks.
type errTooMany int

func (e errTooMany) Error() string {
	return fmt.Sprintf("kubelock agent: %d locks are held or awaited at once, the most this agent takes (--max-locks)", int(e))
}

// reserve counts an acquire under way, within MaxLocks; release it with
// unreserve.
func (a *Agent) reserve() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case a.closed:
		return errStopping
	case a.pending+len(a.held) >= a.o.MaxLocks:
		return errTooMany(a.o.MaxLocks)
	}
	a.pending++
	return nil
}

func (a *Agent) unreserve() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pending--
}

// take acquires key in the session for the app: TryAcquire when wait is 0,
// else Acquire waiting up to wait in the lock's queue. The holding lasts
// until the app releases it or lets lease pass without a renewal.
func (a *Agent) take(ctx context.Context, key string, wait time.Duration, shared bool, lease time.Duration, owner string) (*holding, error) {
	if err := a.reserve(); err != nil {
		return nil, err
	}
	defer a.unreserve()
	s, err := a.liveSession(ctx)
	if err != nil {
		return nil, unavailable{err}
	}
	opts := []lock.AcquireOption{lock.WithSession(s)}
	if shared {
		opts = append(opts, lock.WithShared())
	}
	var l *lock.Lock
	if wait > 0 {
		l, err = a.c.Acquire(ctx, key, append(opts, lock.WithWaitTimeout(wait))...)
	} else {
		l, err = a.c.TryAcquire(ctx, key, opts...)
	}
	if err != nil {
		return nil, err
	}
	h := a.track(l, key, owner, lease, s.Name())
	if ctx.Err() != nil { // the app went away while the lock was taken: nobody will release it
		_, _ = a.end(h, endReleased)
		return nil, ctx.Err()
	}
	return h, nil
}

// unavailable is a session that could not be opened: the apiserver is
// unreachable, or refuses.
type unavailable struct{ err error }

func (e unavailable) Error() string {
	return "kubelock agent: no session to take locks in: " + e.err.Error()
}
func (e unavailable) Unwrap() error { return e.err }

// track registers l as a holding, its lease running, and forgets it into
// the ended holdings when it ends, however it ends.
func (a *Agent) track(l *lock.Lock, key, owner string, lease time.Duration, session string) *holding {
	h := &holding{l: l, key: key, owner: owner, lease: lease, session: session, leaseEnd: time.Now().Add(lease)}
	h.mu.Lock()
	h.timer = time.AfterFunc(lease, func() { a.expire(h) })
	h.mu.Unlock()
	a.mu.Lock()
	a.held[l.LeaseID()] = h
	a.mu.Unlock()
	context.AfterFunc(l.Context(), func() { a.forget(h) })
	return h
}

// forget moves h, which ended, from the live holdings to the ended ones.
func (a *Agent) forget(h *holding) {
	h.mu.Lock()
	h.timer.Stop()
	h.mu.Unlock()
	id := h.l.LeaseID()
	a.mu.Lock()
	delete(a.held, id)
	a.mu.Unlock()
	a.ended.Add(id, h)
	if _, reason, cause := h.state(); reason == endLost {
		a.logf("lost %s (token %d, lease %s): %v", shown(h.key), h.l.FencingToken(), id, cause)
	}
}

// expire releases h when its lease ended without a renewal.
func (a *Agent) expire(h *holding) {
	if h.claimExpiry() {
		a.logf("releasing %s (token %d, lease %s): not renewed within its lease of %s", shown(h.key), h.l.FencingToken(), h.l.LeaseID(), h.lease)
		_ = a.release(h) // it logs a failure: the holding then ends with the session
	}
}

// end releases h for why, unless it is ending already (claimed false). Its
// error is pkg/lock's: nil once released, wrapping lock.ErrLockLost when h
// was lost first, another when the release is not confirmed.
func (a *Agent) end(h *holding, why string) (claimed bool, err error) {
	if !h.claimEnd(why) {
		return false, nil
	}
	return true, a.release(h)
}

// release writes the end of h, retrying for up to the session's TTL: past
// it, an apiserver that did not answer also missed the session's renewals,
// and the controller ends the holding with the session.
func (a *Agent) release(h *holding) error {
	ctx, cancel := context.WithTimeout(context.Background(), a.o.SessionTTL)
	defer cancel()
	err := h.l.Release(ctx)
	if err != nil && !errors.Is(err, lock.ErrLockLost) {
		a.logf("releasing %s (lease %s) failed; it ends with the session: %v", shown(h.key), h.l.LeaseID(), err)
	}
	return err
}

// lookup finds the holding of key with leaseID: live, or among the ended
// ones (nil when neither).
func (a *Agent) lookup(key, leaseID string) *holding {
	a.mu.Lock()
	h := a.held[leaseID]
	a.mu.Unlock()
	if h == nil {
		if v, ok := a.ended.Get(leaseID); ok {
			h = v.(*holding) //nolint:errcheck // the cache holds only holdings
		}
	}
	if h == nil || h.key != key {
		return nil
	}
	return h
}

// holdings are the live holdings that match (all with match nil), sorted by
// key and lease ID.
func (a *Agent) holdings(match func(*holding) bool) []*holding {
	a.mu.Lock()
	var out []*holding
	for _, h := range a.held {
		if match == nil || match(h) {
			out = append(out, h)
		}
	}
	a.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].key != out[j].key {
			return out[i].key < out[j].key
		}
		return out[i].l.LeaseID() < out[j].l.LeaseID()
	})
	return out
}

// Close refuses new acquires, releases every holding and closes the
// session: the app beside it has stopped, or is about to.
func (a *Agent) Close() {
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
	var wg sync.WaitGroup
	for _, h := range a.holdings(nil) {
		wg.Go(func() { _, _ = a.end(h, endReleased) })
	}
	wg.Wait()
	a.smu.Lock()
	s := a.session
	a.smu.Unlock()
	if s != nil {
		a.closeSession(s)
	}
}

func (a *Agent) logf(format string, args ...any) { a.o.Logf(format, args...) }

// shown is a key or owner as the log and the answers show it: the app wrote it.
func shown(s string) string { return escape.Printable(escape.Clip(s, 200)) }
