package leaderelection

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	clientle "k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
)

// Defaults of Options: client-go's and controller-runtime's.
const (
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
)

// Options are the elector's timings, which a ResourceLock needs to keep its
// promise that the leader stops before anyone else starts. Give the elector
// (client-go's LeaderElectionConfig, controller-runtime's ctrl.Options) the
// same values; ElectionConfig does it for client-go.
type Options struct {
	// LeaseDuration is the holding's lease and the elector's LeaseDuration:
	// whole seconds within 1s..1h and the lock's spec.maxLeaseDurationSeconds.
	// A leader that dies without releasing keeps the lock this long, plus the
	// controller's expiry grace. Default DefaultLeaseDuration.
	LeaseDuration time.Duration
	// RenewDeadline is the elector's: how long the leader retries renewing
	// before it stops leading. Default DefaultRenewDeadline.
	RenewDeadline time.Duration
	// RetryPeriod is the elector's: the pause between its tries. A candidate
	// does not poll at this rate (it waits in the lock's queue), but the
	// leader's elector calls Update this often. Default DefaultRetryPeriod.
	RetryPeriod time.Duration
	// EventRecorder, when set, records the elector's "became leader" and
	// "stopped leading" as Events about the DistributedLock. Default: none
	// (each Event is an apiserver write).
	EventRecorder resourcelock.EventRecorder
	// ReportLeaderChanges makes a waiting candidate's Get return whenever the
	// lock passes to another holder, so that client-go's OnNewLeader and
	// GetLeader follow the leader. The cost: after each such return client-go
	// pauses RetryPeriod × 1..2.2 before it asks again, and a release in that
	// pause reaches this candidate only when the pause ends. Default false:
	// Get returns only when this candidate's turn came (or the campaign
	// failed), and the hand-off takes milliseconds.
	ReportLeaderChanges bool
	// OnCampaign, when set, hears how this candidate's campaign goes: the
	// error of every attempt to join the lock's queue or take the lock that
	// failed (no credentials, no permission, a denied write), then nil once a
	// later attempt got into the queue or took the lock. A candidate waiting
	// in the queue is healthy; one whose attempts fail cannot take over when
	// the leader goes, which only this says (the elector logs each failure,
	// but a failing candidate and a waiting one look alike to it). Called on
	// the campaign's goroutine; it must return quickly. Default: none.
	OnCampaign func(err error)
}

func (o Options) withDefaults() Options {
	if o.LeaseDuration == 0 {
		o.LeaseDuration = DefaultLeaseDuration
	}
	if o.RenewDeadline == 0 {
		o.RenewDeadline = DefaultRenewDeadline
	}
	if o.RetryPeriod == 0 {
		o.RetryPeriod = DefaultRetryPeriod
	}
	return o
}

// Validate checks the timings (defaults filled in) as New does.
func (o Options) Validate() error { return o.withDefaults().validate() }

func (o Options) validate() error {
	l, rd, rp := o.LeaseDuration, o.RenewDeadline, o.RetryPeriod
	switch {
	case l < time.Second || l > locksv1alpha1.MaxLeaseDurationSeconds*time.Second || l%time.Second != 0:
		return fmt.Errorf("kubelock: leader election: the lease duration must be whole seconds within 1s..%ds, got %s", locksv1alpha1.MaxLeaseDurationSeconds, l)
	case rd <= 0 || rp <= 0:
		return fmt.Errorf("kubelock: leader election: the renew deadline (%s) and the retry period (%s) must be positive", rd, rp)
	case rd <= time.Duration(clientle.JitterFactor*float64(rp)):
		return fmt.Errorf("kubelock: leader election: the renew deadline (%s) must exceed %v times the retry period (%s), as client-go requires", rd, clientle.JitterFactor, rp)
	case rp+rd >= l-lock.SafetyMargin(l):
		// The elector may lead for rp+rd after a successful Update; a holding
		// renewed at that Update is safe for the lease minus the margin.
		return fmt.Errorf("kubelock: leader election: the retry period plus the renew deadline (%s) must be shorter than the lease duration minus the client's safety margin (%s - %s), so that the leader stops before its holding can expire",
			rp+rd, l, lock.SafetyMargin(l))
	}
	return nil
}

// ResourceLock is client-go's resourcelock.Interface on one DistributedLock.
// Its methods are for the elector; FencingToken and Holding are for the
// leader's own code. Build one with New.
type ResourceLock struct {
	c    *lock.Client
	key  string
	name string
	o    Options

	mu sync.Mutex
	// changed is closed and replaced whenever a field below changes.
	changed chan struct{}

	// campaigning is set while the campaign goroutine waits in the queue.
	campaigning bool
	// queue is what the campaign last learned while waiting; queueSeen is
	// false until it learned anything.
	queueSeen bool
	queue     lock.QueueStatus
	// reported is the holder's leaseID ("" when free) that the elector last
	// heard about from a candidate's Get or Update; notReported before that.
	reported string
	// errs counts campaign failures; errsSeen those returned to the elector.
	errs, errsSeen int
	lastErr        error
	// failing is set from a failed attempt until a later one got into the
	// queue or took the lock (Options.OnCampaign).
	failing bool

	// held is the holding the campaign won, nil before; heldAt is when.
	held   *lock.Lock
	heldAt time.Time
	// renewedAt is when the leader last renewed; transitions is
	// status.transitions as read once while holding (-1 before).
	renewedAt   time.Time
	transitions int64
	// claimed is set once the elector took the holding (an Update as leader
	// succeeded); a holding nobody claimed is released when the campaign ends.
	claimed bool
	// ended is why the holding ended (lock.ErrReleased, or an error wrapping
	// lock.ErrLockLost); this term is over then.
	ended error
}

// notReported is the reported value before the elector heard of any holder.
const notReported = "\x00"

// New returns a ResourceLock on the DistributedLock of key, for a candidate
// connecting with cfg. opts configure its kubelock client (namespace,
// identity, auto-create, metrics); the identity (lock.WithIdentity, default
// POD_NAME or the hostname) is the candidate's identity in the election and
// must be unique among the candidates. The client does not renew in the
// background: the elector's Update renews when needed, and a holding the
// elector abandons lapses after its lease.
func New(cfg *rest.Config, key string, o Options, opts ...lock.Option) (*ResourceLock, error) {
	o = o.withDefaults()
	if err := o.validate(); err != nil {
		return nil, err
	}
	name, err := lock.NameForKey(key)
	if err != nil {
		return nil, err
	}
	c, err := lock.New(cfg, append(slices.Clip(opts), lock.WithoutAutoRenew())...)
	if err != nil {
		return nil, err
	}
	return &ResourceLock{c: c, key: key, name: name, o: o, changed: make(chan struct{}), reported: notReported, transitions: -1}, nil
}

// Options are the timings in effect (defaults filled in).
func (r *ResourceLock) Options() Options { return r.o }

// ElectionConfig is client-go's LeaderElectionConfig for this lock: its
// timings, ReleaseOnCancel (a graceful stop hands over at once; cancel the
// context of Run only after the guarded work stopped) and cb.
func (r *ResourceLock) ElectionConfig(cb clientle.LeaderCallbacks) clientle.LeaderElectionConfig {
	return clientle.LeaderElectionConfig{
		Lock:            r,
		LeaseDuration:   r.o.LeaseDuration,
		RenewDeadline:   r.o.RenewDeadline,
		RetryPeriod:     r.o.RetryPeriod,
		ReleaseOnCancel: true,
		Callbacks:       cb,
		Name:            r.Describe(),
	}
}

// Identity is this candidate's identity (the kubelock client's).
func (r *ResourceLock) Identity() string { return r.c.Identity() }

// Describe names the lock: namespace/name.
func (r *ResourceLock) Describe() string { return r.c.Namespace() + "/" + r.name }

// Holding is the holding this candidate won, nil before it won. Its Context
// ends when the holding is released or lost; its FencingToken is the leader's.
func (r *ResourceLock) Holding() *lock.Lock {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.held
}

// FencingToken is the leader's fencing token: that of this candidate's
// holding while it lasts, 0 otherwise. Protected resources accept only a token
// at least as high as every one they saw, so a deposed leader's writes fail.
func (r *ResourceLock) FencingToken() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.held == nil || r.ended != nil {
		return 0
	}
	return r.held.FencingToken()
}

// RecordEvent records an elector event about the lock, with an EventRecorder.
func (r *ResourceLock) RecordEvent(s string) {
	if r.o.EventRecorder == nil {
		return
	}
	subject := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: r.c.Namespace(), Name: r.name}}
	subject.APIVersion, subject.Kind = locksv1alpha1.GroupVersion.String(), "DistributedLock"
	r.o.EventRecorder.Eventf(subject, corev1.EventTypeNormal, "LeaderElection", "%s %s", r.Identity(), s)
}

// Get returns the lock's holder as an election record. A candidate that does
// not hold the lock joins its queue (once) and blocks until it holds the lock,
// the campaign fails, or ctx ends (with ReportLeaderChanges, also until the
// holder differs from the one the elector last heard of). The leader's Get
// reads nothing after the first.
func (r *ResourceLock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	if err := r.turn(ctx); err != nil {
		return nil, nil, err
	}
	r.mu.Lock()
	held, ended, transitions := r.held, r.ended, r.transitions
	switch {
	case ended != nil:
		// The term is over; who holds the lock now is not this candidate's
		// business, and must not cost a request while the elector steps down.
		r.mu.Unlock()
		return encode(&resourcelock.LeaderElectionRecord{LeaderTransitions: int(max(transitions, 0))})
	case held != nil && transitions >= 0:
		rec := r.heldRecordLocked()
		r.mu.Unlock()
		return encode(rec)
	case held == nil && r.errs != r.errsSeen:
		r.errsSeen = r.errs
		err := r.lastErr
		r.mu.Unlock()
		return nil, nil, err
	case held == nil:
		r.reported = holderLeaseID(r.queue.Holder)
	}
	r.mu.Unlock()

	rctx := ctx
	if held != nil {
		// Bounded by the holding's safe deadline, so this read never keeps a
		// leader leading past it.
		var cancel context.CancelFunc
		rctx, cancel = context.WithDeadline(ctx, held.ExpiresAt())
		defer cancel()
	}
	obj, err := r.c.Get(rctx, r.key)
	if err != nil {
		return nil, nil, err
	}
	if held != nil && isHolder(obj, held) {
		r.mu.Lock()
		r.transitions = obj.Status.Transitions
		rec := r.heldRecordLocked()
		r.mu.Unlock()
		return encode(rec)
	}
	return encode(record(obj))
}

// Create is Update: the lock object is created by the kubelock client when
// it was made lock.WithAutoCreate, else by an administrator; Get never
// reports a missing lock as NotFound.
func (r *ResourceLock) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	return r.Update(ctx, ler)
}

// Update is the elector's write. With an empty holder (ReleaseOnCancel) it
// releases this candidate's holding, giving up at the holding's safe
// deadline. With this candidate as holder it succeeds only while this
// candidate holds the lock and the holding stays provable for longer than the
// elector may lead without another Update (RetryPeriod + RenewDeadline),
// renewing first when it would not. A candidate that does not hold the lock
// waits as in Get and fails unless its turn came.
func (r *ResourceLock) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	if ler.HolderIdentity == "" {
		return r.release(ctx)
	}
	if ler.HolderIdentity != r.Identity() {
		return fmt.Errorf("kubelock: %s: refusing to write holder %q: a candidate only ever writes itself", r.Describe(), ler.HolderIdentity)
	}
	if want := int(r.o.LeaseDuration / time.Second); ler.LeaseDurationSeconds != want {
		return fmt.Errorf("kubelock: %s: the elector's lease duration is %ds but this lock's is %ds: give the elector the timings of the ResourceLock's Options",
			r.Describe(), ler.LeaseDurationSeconds, want)
	}
	if err := r.turn(ctx); err != nil {
		return err
	}
	r.mu.Lock()
	l, ended := r.held, r.ended
	if l == nil {
		defer r.mu.Unlock()
		if r.errs != r.errsSeen {
			r.errsSeen = r.errs
			return r.lastErr
		}
		r.reported = holderLeaseID(r.queue.Holder)
		return r.waitingErr()
	}
	r.mu.Unlock()
	if ended != nil {
		return r.overErr(ended)
	}
	renewed, err := r.keep(ctx, l)
	r.mu.Lock()
	defer r.mu.Unlock()
	if !renewed.IsZero() {
		r.renewedAt = renewed
	}
	if r.ended != nil {
		// Released or lost meanwhile (the campaign's end released it unclaimed).
		return r.overErr(r.ended)
	}
	if err != nil {
		return err
	}
	r.claimed = true
	return nil
}

// keep makes sure the holding stays provable for longer than the elector may
// lead without another Update, renewing it when needed. renewed is when a
// renewal committed, zero when none did.
func (r *ResourceLock) keep(ctx context.Context, l *lock.Lock) (renewed time.Time, err error) {
	need := r.o.RetryPeriod + r.o.RenewDeadline
	if time.Until(l.ExpiresAt()) > need && l.Err() == nil {
		return time.Time{}, nil
	}
	if err := l.Renew(ctx); err != nil {
		return time.Time{}, fmt.Errorf("kubelock: renewing the leader's holding of %s: %w", r.Describe(), err)
	}
	renewed = time.Now()
	if left := time.Until(l.ExpiresAt()); left <= need {
		return renewed, fmt.Errorf("kubelock: %s: the renewal answered too late: the holding is provable for %s more, but the elector may lead for %s (retry period + renew deadline) after this call",
			r.Describe(), left.Round(time.Millisecond), need)
	}
	return renewed, nil
}

// release ends this candidate's holding, if it has one, giving up at its
// safe deadline; after that the holding lapses by itself.
func (r *ResourceLock) release(ctx context.Context) error {
	r.mu.Lock()
	l := r.held
	if l == nil || r.ended != nil {
		r.mu.Unlock()
		return nil
	}
	r.ended = lock.ErrReleased
	r.broadcastLocked()
	r.mu.Unlock()
	rctx, cancel := context.WithDeadline(ctx, l.ExpiresAt())
	defer cancel()
	if err := l.Release(rctx); err != nil {
		return fmt.Errorf("kubelock: releasing leadership on %s: %w", r.Describe(), err)
	}
	return nil
}

// turn waits, for a candidate that does not hold the lock, until there is
// something the elector should hear: the campaign won or failed, the term
// ended, or (with ReportLeaderChanges) the holder is not the one last
// reported. The first call starts the campaign, which lives as long as that
// call's ctx: client-go passes the context of its acquire loop.
func (r *ResourceLock) turn(ctx context.Context) error {
	for {
		r.mu.Lock()
		if r.held == nil && !r.campaigning {
			r.campaigning = true
			go r.campaign(ctx)
		}
		news := r.held != nil || r.ended != nil || r.errs != r.errsSeen ||
			(r.o.ReportLeaderChanges && r.queueSeen && holderLeaseID(r.queue.Holder) != r.reported)
		changed := r.changed
		r.mu.Unlock()
		if news {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kubelock: waiting for leadership on %s: %w", r.Describe(), ctx.Err())
		case <-changed:
		}
	}
}

// campaign waits in the lock's queue until it holds the lock or ctx ends.
func (r *ResourceLock) campaign(ctx context.Context) {
	for ctx.Err() == nil {
		l, err := r.c.Acquire(ctx, r.key, lock.WithLeaseDuration(r.o.LeaseDuration), lock.WithQueueCallback(r.queued))
		if err == nil {
			r.won(ctx, l)
			return
		}
		if ctx.Err() != nil {
			break
		}
		if errors.Is(err, lock.ErrTimeout) {
			continue // waited as long as the client allows: queue again
		}
		r.mu.Lock()
		r.errs++
		r.lastErr = fmt.Errorf("kubelock: campaigning for %s: %w", r.Describe(), err)
		r.failing = true
		r.broadcastLocked()
		r.mu.Unlock()
		r.report(r.lastErr)
		t := time.NewTimer(r.o.RetryPeriod)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	r.mu.Lock()
	r.campaigning, r.queueSeen = false, false
	r.broadcastLocked()
	r.mu.Unlock()
}

// queued is the campaign's WithQueueCallback.
func (r *ResourceLock) queued(q lock.QueueStatus) {
	r.mu.Lock()
	r.queueSeen, r.queue = true, q
	r.broadcastLocked()
	r.mu.Unlock()
	r.recovered()
}

// report tells Options.OnCampaign how the campaign goes.
func (r *ResourceLock) report(err error) {
	if r.o.OnCampaign != nil {
		r.o.OnCampaign(err)
	}
}

// recovered reports nil once after failed attempts: this one got into the
// queue or took the lock.
func (r *ResourceLock) recovered() {
	r.mu.Lock()
	was := r.failing
	r.failing = false
	r.mu.Unlock()
	if was {
		r.report(nil)
	}
}

// won records the campaign's holding. The term ends with it; a holding the
// elector never claimed is released when the campaign's context ends (the
// elector stopped before it heard of it).
func (r *ResourceLock) won(ctx context.Context, l *lock.Lock) {
	r.mu.Lock()
	r.held, r.heldAt, r.campaigning = l, time.Now(), false
	r.broadcastLocked()
	r.mu.Unlock()
	r.recovered()
	context.AfterFunc(l.Context(), func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.ended == nil {
			r.ended = l.Err()
		}
		r.broadcastLocked()
	})
	context.AfterFunc(ctx, func() {
		r.mu.Lock()
		claimed := r.claimed
		r.mu.Unlock()
		if !claimed {
			_ = r.release(context.WithoutCancel(ctx))
		}
	})
}

// heldRecordLocked is the election record of this candidate's holding.
func (r *ResourceLock) heldRecordLocked() *resourcelock.LeaderElectionRecord {
	renewed := r.heldAt
	if r.renewedAt.After(renewed) {
		renewed = r.renewedAt
	}
	return &resourcelock.LeaderElectionRecord{
		HolderIdentity:       r.Identity(),
		LeaseDurationSeconds: int(r.o.LeaseDuration / time.Second),
		AcquireTime:          metav1.NewTime(r.heldAt),
		RenewTime:            metav1.NewTime(renewed),
		LeaderTransitions:    int(r.transitions),
	}
}

func (r *ResourceLock) waitingErr() error {
	q := r.queue
	if q.Holder == nil {
		return fmt.Errorf("kubelock: %s is free and its queue's head takes it; this candidate waits at position %d of %d", r.Describe(), q.Position, q.Waiters)
	}
	return fmt.Errorf("kubelock: %s is held by %s (user %s); this candidate waits at position %d of %d in its queue",
		r.Describe(), q.Holder.Identity, q.Holder.User, q.Position, q.Waiters)
}

func (r *ResourceLock) overErr(cause error) error {
	return fmt.Errorf("kubelock: %s: this candidate's term is over (%w); build a new ResourceLock to stand again", r.Describe(), cause)
}

func (r *ResourceLock) broadcastLocked() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// record maps a lock's status to an election record: the holder's identity,
// lease and times, and the lock's transitions.
func record(obj *locksv1alpha1.DistributedLock) *resourcelock.LeaderElectionRecord {
	rec := &resourcelock.LeaderElectionRecord{LeaderTransitions: int(obj.Status.Transitions)}
	if h := obj.Status.Holder; h != nil {
		rec.HolderIdentity = h.Identity
		rec.LeaseDurationSeconds = int(h.LeaseDurationSeconds)
		rec.AcquireTime = metav1.NewTime(h.AcquireTime.Time)
		rec.RenewTime = rec.AcquireTime
		if h.RenewTime != nil {
			rec.RenewTime = metav1.NewTime(h.RenewTime.Time)
		}
	}
	return rec
}

// isHolder reports whether obj's holder is the holding l.
func isHolder(obj *locksv1alpha1.DistributedLock, l *lock.Lock) bool {
	h := obj.Status.Holder
	return h != nil && h.LeaseID == l.LeaseID() && h.RequestID == l.RequestID() && obj.Status.FencingToken == l.FencingToken()
}

func holderLeaseID(h *locksv1alpha1.LockHolder) string {
	if h == nil {
		return ""
	}
	return h.LeaseID
}

func encode(rec *resourcelock.LeaderElectionRecord) (*resourcelock.LeaderElectionRecord, []byte, error) {
	raw, err := json.Marshal(rec)
	if err != nil {
		return nil, nil, err
	}
	return rec, raw, nil
}
