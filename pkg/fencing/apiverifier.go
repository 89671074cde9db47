package fencing

import (
	"context"
	"fmt"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// Defaults of an APIVerifier.
const (
	// DefaultCatchUp bounds how long Verify waits for its cached view of a lock
	// to reach a token above it before calling the token never issued.
	DefaultCatchUp = 3 * time.Second
	// DefaultSyncTimeout bounds how long Verify waits for a new watch to list
	// its lock before returning ErrNotSynced.
	DefaultSyncTimeout = 10 * time.Second
)

// APIVerifier is a Verifier backed by the apiserver: one watch per guarded
// lock (a list and watch of that one object by name), started lazily by the
// first Verify of the lock and kept until Close.
//
// The cache may lag the apiserver, never lead it, so the check errs in the
// benign direction only: a token issued a moment ago can look "not issued
// yet". Verify then waits (at most the catch-up bound, DefaultCatchUp) for the
// watch to deliver the lock's newer state before refusing, as Chubby's
// CheckSequencer compares against the master's current view. Issuance is
// stable (a lock's token only grows), so a token once verified stays valid
// and Verify can run outside the resource's own transaction.
//
// The verifier needs get, list and watch on distributedlocks in the locks'
// namespaces. Only the locks the resource names are ever watched: resolve
// them from the resource's configuration, never from a request.
type APIVerifier struct {
	c           client.WithWatch
	catchUp     time.Duration
	syncTimeout time.Duration

	ctx    context.Context
	cancel context.CancelFunc
	mu     sync.Mutex
	locks  map[LockRef]*watchedLock
	wg     sync.WaitGroup
}

// VerifierOption configures an APIVerifier.
type VerifierOption func(*APIVerifier)

// WithCatchUp sets how long Verify waits for the watch to catch up to a token
// above the cached one (default DefaultCatchUp).
func WithCatchUp(d time.Duration) VerifierOption { return func(v *APIVerifier) { v.catchUp = d } }

// WithSyncTimeout sets how long Verify waits for a lock's watch to list it
// the first time (default DefaultSyncTimeout).
func WithSyncTimeout(d time.Duration) VerifierOption {
	return func(v *APIVerifier) { v.syncTimeout = d }
}

// NewAPIVerifier returns a verifier that reads locks with c, whose scheme must
// know the kubelock types (NewAPIVerifierForConfig builds one). Close it to
// stop its watches.
func NewAPIVerifier(c client.WithWatch, opts ...VerifierOption) *APIVerifier {
	ctx, cancel := context.WithCancel(context.Background())
	v := &APIVerifier{c: c, catchUp: DefaultCatchUp, syncTimeout: DefaultSyncTimeout,
		ctx: ctx, cancel: cancel, locks: map[LockRef]*watchedLock{}}
	for _, o := range opts {
		o(v)
	}
	return v
}

// NewAPIVerifierForConfig is NewAPIVerifier with a client for cfg.
func NewAPIVerifierForConfig(cfg *rest.Config, opts ...VerifierOption) (*APIVerifier, error) {
	// The verifier reads nothing but locks.
	scheme := runtime.NewScheme()
	if err := locksv1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("kubelock: building the verifier's client: %w", err)
	}
	return NewAPIVerifier(c, opts...), nil
}

// Close stops every watch and waits for them to end.
func (v *APIVerifier) Close() {
	v.cancel()
	v.wg.Wait()
}

// Verify implements Verifier: nil when token <= the lock's current
// fencingToken, waiting up to the catch-up bound for a lagging cache. For a
// slot, the token must also be one the lock issued to that slot: its current
// shared holding there, or a finished holding of that slot that
// recentAcquisitions still records. Once the cache has caught up to the
// token, any other answer is final: issuance never changes afterwards.
func (v *APIVerifier) Verify(ctx context.Context, lock LockRef, token int64) error {
	w, err := v.watch(lock.lock())
	if err != nil {
		return err
	}
	if err := w.waitSynced(ctx, v.syncTimeout); err != nil {
		return err
	}
	deadline := time.NewTimer(v.catchUp)
	defer deadline.Stop()
	for {
		current, exists, issued, changed := w.view()
		if exists && token <= current {
			if lock.Slot == nil || issued[slotToken{*lock.Slot, token}] {
				return nil
			}
			return notIssued(lock, token, fmt.Sprintf("the lock issued it to no holding of slot %d it still records", *lock.Slot))
		}
		select {
		case <-changed:
		case <-deadline.C:
			reason := "the token is above the lock's current token"
			if !exists {
				reason = "the lock does not exist"
			}
			return notIssued(lock, token, reason)
		case <-ctx.Done():
			return fmt.Errorf("kubelock: verifying token %d of lock %s: %w", token, lock, ctx.Err())
		}
	}
}

// watch returns the lock's watch, starting it on first use.
func (v *APIVerifier) watch(lock LockRef) (*watchedLock, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.ctx.Err() != nil {
		return nil, fmt.Errorf("kubelock: the verifier is closed")
	}
	if w, ok := v.locks[lock]; ok {
		return w, nil
	}
	w := &watchedLock{ref: lock, changed: make(chan struct{})}
	_, ctrl := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: v.listWatch(w),
		ObjectType:    &locksv1alpha1.DistributedLock{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    w.set,
			UpdateFunc: func(_, obj any) { w.set(obj) },
			DeleteFunc: func(any) { w.gone() },
		},
	})
	w.synced = ctrl.HasSyncedChecker().Done()
	v.locks[lock] = w
	v.wg.Go(func() { ctrl.RunWithContext(v.ctx) })
	return w, nil
}

// listWatch lists and watches the one lock by name, remembering the last
// error so that ErrNotSynced can say why (RBAC, a missing CRD).
func (v *APIVerifier) listWatch(w *watchedLock) *cache.ListWatch {
	opts := func(raw metav1.ListOptions) *client.ListOptions {
		return &client.ListOptions{Namespace: w.ref.Namespace,
			FieldSelector: fields.OneTermEqualSelector("metadata.name", w.ref.Name), Raw: &raw}
	}
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			list := &locksv1alpha1.DistributedLockList{}
			err := v.c.List(ctx, list, opts(o))
			w.setErr(err)
			return list, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			wi, err := v.c.Watch(ctx, &locksv1alpha1.DistributedLockList{}, opts(o))
			w.setErr(err)
			return wi, err
		},
	}
}

// watchedLock is the cached view of one lock.
type watchedLock struct {
	ref LockRef
	// synced is closed once the watch has listed the lock.
	synced <-chan struct{}

	mu      sync.Mutex
	token   int64
	exists  bool
	issued  map[slotToken]bool // the shared holdings status records, current and finished
	lastErr error
	// changed is closed (and replaced) whenever the view changes.
	changed chan struct{}
}

// slotToken is a token issued to a slot.
type slotToken struct {
	slot  int32
	token int64
}

func (w *watchedLock) set(obj any) {
	l, ok := obj.(*locksv1alpha1.DistributedLock)
	if !ok {
		return
	}
	issued := map[slotToken]bool{}
	for _, h := range l.Status.SharedHolders {
		issued[slotToken{h.Slot, h.FencingToken}] = true
	}
	for _, f := range l.Status.RecentAcquisitions {
		if f.Slot != nil {
			issued[slotToken{*f.Slot, f.FencingToken}] = true
		}
	}
	w.update(func() { w.token, w.exists, w.issued = l.Status.FencingToken, true, issued })
}

func (w *watchedLock) gone() { w.update(func() { w.token, w.exists, w.issued = 0, false, nil }) }

func (w *watchedLock) setErr(err error) {
	w.mu.Lock()
	w.lastErr = err
	w.mu.Unlock()
}

func (w *watchedLock) update(f func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	f()
	close(w.changed)
	w.changed = make(chan struct{})
}

// view is the cached state; issued is never modified after it is set.
func (w *watchedLock) view() (token int64, exists bool, issued map[slotToken]bool, changed <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.token, w.exists, w.issued, w.changed
}

// waitSynced waits until the watch has listed the lock once.
func (w *watchedLock) waitSynced(ctx context.Context, timeout time.Duration) error {
	select {
	case <-w.synced:
		return nil
	default:
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-w.synced:
		return nil
	case <-ctx.Done():
	case <-timer.C:
	}
	w.mu.Lock()
	last := w.lastErr
	w.mu.Unlock()
	if last != nil {
		return fmt.Errorf("%w: watching lock %s: %w", ErrNotSynced, w.ref, last)
	}
	return fmt.Errorf("%w: the watch of lock %s has not listed it yet", ErrNotSynced, w.ref)
}
