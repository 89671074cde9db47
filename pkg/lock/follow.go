package lock

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/apimachinery/pkg/watch"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// followWait bounds how long a holding whose write met a conflict waits for
// its watch to bring the version that won before it reads the lock instead:
// the winner's event is usually there before the 409 is.
const followWait = 250 * time.Millisecond

// follower keeps a holding's view of its lock current from the watch its
// acquire waited on, from the acquisition until the release is written (or
// the holding ends otherwise, or the context the caller passed to Acquire
// ends: the watch lives within it). While others join and leave the queue, the
// holding's renewals and its release then write on the version the watch
// brought, instead of meeting a conflict and reading the lock again. It only
// feeds the client's last-seen objects (seenLocks): every write still
// carries the resourceVersion it was based on as its precondition.
type follower struct {
	seen seenLocks
	name string
	w    *lockWatch

	mu      sync.Mutex
	changed chan struct{} // closed at the next event (or the end), then replaced
	ended   bool          // the watch ended or stop was called

	stopOnce sync.Once
	done     chan struct{}
}

// follow makes l follow its lock with w (a running watch of it), which it
// then owns. Call before start: finishLocked reads l.fol.
func (l *Lock) follow(w *lockWatch) {
	if w == nil || w.w == nil {
		return // no watch (it had failed): conflicts are read after
	}
	f := &follower{seen: l.c.seen, name: l.name, w: w, changed: make(chan struct{}), done: make(chan struct{})}
	l.fol = f
	go f.run()
}

func (f *follower) run() {
	defer f.w.stop()
	defer f.end()
	for {
		select {
		case <-f.done:
			return
		case ev, ok := <-f.w.w.ResultChan():
			if !ok {
				return
			}
			obj, isLock := ev.Object.(*locksv1alpha1.DistributedLock)
			if !isLock || (ev.Type != watch.Modified && ev.Type != watch.Added) {
				return // deleted, or an error: a conflict reads the lock
			}
			f.seen.saw(obj)
			f.mu.Lock()
			close(f.changed)
			f.changed = make(chan struct{})
			f.mu.Unlock()
		}
	}
}

func (f *follower) end() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.ended {
		f.ended = true
		close(f.changed)
	}
}

// stop ends following (idempotent; nil-safe: a holding that never waited
// follows nothing).
func (f *follower) stop() {
	if f == nil {
		return
	}
	f.stopOnce.Do(func() { close(f.done) })
}

// newer waits, at most followWait, until the client has seen a version of
// the lock newer than rv, and returns a copy of it; nil when the watch ended,
// ctx ended or the wait ran out first.
func (f *follower) newer(ctx context.Context, rv string) *locksv1alpha1.DistributedLock {
	if f == nil {
		return nil
	}
	t := time.NewTimer(followWait)
	defer t.Stop()
	for {
		f.mu.Lock()
		changed, ended := f.changed, f.ended
		f.mu.Unlock()
		if obj, ok := f.seen.get(f.name); ok && newerRV(obj.ResourceVersion, rv) {
			return obj
		}
		if ended {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil
		case <-t.C:
			return nil
		}
	}
}

// newerRV reports whether resourceVersion a is newer than b.
func newerRV(a, b string) bool {
	c, err := resourceversion.CompareResourceVersion(a, b)
	return err == nil && c > 0
}

// base is a copy of the version of the lock this holding's next write goes
// on: the newest the client has seen (its watch, another request's response)
// while that still shows this holding, else the last this holding wrote or
// read. A stale base costs a conflict, never a wrong write: every write
// carries its resourceVersion as precondition. Callers hold l.wmu.
func (l *Lock) base() *locksv1alpha1.DistributedLock {
	if s, ok := l.c.seen.get(l.name); ok && s.UID == l.obj.UID && newerRV(s.ResourceVersion, l.obj.ResourceVersion) && l.holds(&s.Status) {
		l.obj = s
	}
	return l.obj.DeepCopy()
}

// caughtUp, after a write of this holding met a conflict, takes the version
// that won from the watch the holding follows: true when it still shows this
// holding (l.obj is then that version), false when the caller should read the
// lock (nothing followed, the watch lagged or ended, or the holding is gone,
// which the read then tells). Callers hold l.wmu.
func (l *Lock) caughtUp(ctx context.Context) bool {
	s := l.fol.newer(ctx, l.obj.ResourceVersion)
	if s == nil || s.UID != l.obj.UID || !l.holds(&s.Status) {
		return false
	}
	l.obj = s
	return true
}
