package lock

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"
)

// releaseTimeout bounds the releases AcquireAll sends after a failure, when
// the caller's context may already be over.
const releaseTimeout = 10 * time.Second

// Locks are holdings taken together by AcquireAll. Their Context ends when
// any of them ends (released, lost or unproven), with that holding's cause;
// the others stay held until Release, so call it in any case.
type Locks struct {
	locks []*Lock
	ending
}

// AcquireAll takes the locks of every key, all or nothing, as Curator's
// InterProcessMultiLock and Redisson's MultiLock do. It acquires them one at a
// time in a canonical order (namespace, then object name), whatever the order
// of keys, so two callers taking overlapping sets never wait for each other in
// a cycle. One wait bound covers the whole call: the wait timeout
// (WithWaitTimeout) and ctx's deadline. When any key cannot be taken in time,
// AcquireAll releases what it took and returns the error of that key. opts
// apply to every key (WithShared, WithLeaseDuration, WithRequestID, which is
// per lock object). Keys must name distinct locks.
func (c *Client) AcquireAll(ctx context.Context, keys []string, opts ...AcquireOption) (*Locks, error) {
	if len(keys) == 0 {
		return nil, errors.New("kubelock: acquire all: no keys")
	}
	cfg, err := c.acquireConfig(opts)
	if err != nil {
		return nil, err
	}
	order, err := canonicalOrder(keys)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.waitTimeout)
	defer cancel()
	held := make([]*Lock, len(keys))
	for _, i := range order {
		l, err := c.Acquire(ctx, keys[i], opts...)
		if err != nil {
			abandon(ctx, held)
			return nil, fmt.Errorf("kubelock: acquire all: %q: %w", keys[i], err)
		}
		held[i] = l
	}
	lctx, lcancel := context.WithCancelCause(context.Background())
	for _, l := range held {
		context.AfterFunc(l.ctx, func() { lcancel(context.Cause(l.ctx)) })
	}
	return &Locks{locks: held, ending: ending{lctx, lcancel}}, nil
}

// canonicalOrder is the order in which to acquire keys: by object name (all
// are in the client's namespace). It refuses two keys of one lock object.
func canonicalOrder(keys []string) ([]int, error) {
	names := make([]string, len(keys))
	seen := make(map[string]string, len(keys))
	for i, k := range keys {
		name, err := NameForKey(k)
		if err != nil {
			return nil, err
		}
		if other, ok := seen[name]; ok {
			return nil, fmt.Errorf("kubelock: acquire all: keys %q and %q name the same lock %s", other, k, name)
		}
		seen[name] = k
		names[i] = name
	}
	order := make([]int, len(keys))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return names[order[a]] < names[order[b]] })
	return order, nil
}

// Locks are the holdings, in the order of the keys given to AcquireAll.
func (s *Locks) Locks() []*Lock { return append([]*Lock(nil), s.locks...) }

// Release ends the set's Context (ErrReleased, unless a holding ended it
// before) and releases every holding, in the reverse of the canonical order.
// It returns the holdings' Release errors joined: one wrapping ErrLockLost
// for each that was lost. Releasing again returns nil for those released.
func (s *Locks) Release(ctx context.Context) error {
	s.cancel(ErrReleased)
	return releaseAll(ctx, s.locks)
}

// abandon releases what a failed AcquireAll took, with a deadline of its own:
// ctx may be over. The acquire's error is what the caller needs; a release
// that fails leaves a holding that expires with its lease.
func abandon(ctx context.Context, held []*Lock) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	_ = releaseAll(ctx, held)
}

// releaseAll releases the non-nil holdings, the last acquired first.
func releaseAll(ctx context.Context, locks []*Lock) error {
	byName := make([]*Lock, 0, len(locks))
	for _, l := range locks {
		if l != nil {
			byName = append(byName, l)
		}
	}
	sort.Slice(byName, func(a, b int) bool { return byName[a].name > byName[b].name })
	var errs []error
	for _, l := range byName {
		if err := l.Release(ctx); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", l.key, err))
		}
	}
	return errors.Join(errs...)
}
