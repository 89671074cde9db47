package lock

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// Session is one liveness for many holdings, like etcd's concurrency.Session:
// a LockSession object that the client renews every TTL/3, once for all the
// locks acquired in it (WithSession), which renew nothing themselves. Its
// Context ends (I5) strictly before the controller may expire the session:
// at the send time of the last renewal the apiserver committed, plus the
// TTL, minus the margin a lock uses. The controller then ends every holding
// in it (SessionExpired); Close ends them at once (SessionClosed). The
// cause is ErrSessionClosed after Close, else an error wrapping ErrLockLost.
type Session struct {
	c      *Client
	name   string
	uid    types.UID
	user   string
	ttl    time.Duration
	margin time.Duration
	ending

	deadline safeDeadline

	mu        sync.Mutex
	unproven  bool               // ended because the safe deadline passed, not by the server's word
	renewedAt time.Time          // the renewTime last sent, so that it never goes back
	locks     map[*Lock]struct{} // the live holdings in this session
	checking  bool               // a check of the holdings runs
}

// SessionOption configures NewSession.
type SessionOption func(*sessionConfig)

type sessionConfig struct{ ttl time.Duration }

// WithTTL sets how long the session lives without a renewal (whole seconds,
// 5s..1h; default DefaultSessionTTL). Its holdings carry it as their lease.
func WithTTL(d time.Duration) SessionOption { return func(c *sessionConfig) { c.ttl = d } }

// NewSession creates a session in the client's namespace, named after its
// identity, and starts renewing it. With a token bound to a pod the session
// names that pod and is owned by it, so Kubernetes' garbage collector deletes
// it, and the controller frees its locks, when the pod is gone. A create whose
// outcome is unknown is not retried (it could make a second session; an
// orphan lapses after its TTL). Close it when done.
func (c *Client) NewSession(ctx context.Context, opts ...SessionOption) (*Session, error) {
	cfg := sessionConfig{ttl: DefaultSessionTTL}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.ttl < locksv1alpha1.MinSessionTTLSeconds*time.Second || cfg.ttl > locksv1alpha1.MaxSessionTTLSeconds*time.Second || cfg.ttl%time.Second != 0 {
		return nil, fmt.Errorf("kubelock: session TTL must be whole seconds within %ds..%ds, got %s",
			locksv1alpha1.MinSessionTTLSeconds, locksv1alpha1.MaxSessionTTLSeconds, cfg.ttl)
	}
	user, err := c.User(ctx)
	if err != nil {
		return nil, err
	}
	prefix, _ := NameForKey(c.cfg.identity) // the identity is checked: never empty nor too long
	obj := &locksv1alpha1.LockSession{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.cfg.namespace, GenerateName: prefix + "-"},
		Spec:       locksv1alpha1.LockSessionSpec{User: user, Identity: c.cfg.identity, TTLSeconds: int32(cfg.ttl / time.Second)},
	}
	// Pod fields only from a bound token, and then with the pod's ownerReference.
	if podName, podUID := c.pod(); podUID != "" {
		obj.Spec.PodName, obj.Spec.PodUID = podName, podUID
		obj.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: podName, UID: types.UID(podUID)}}
	}
	sent := c.cfg.clock.Now()
	if err := c.c.Create(ctx, obj); err != nil {
		return nil, fmt.Errorf("kubelock: creating a session in %s: %w", c.cfg.namespace, err)
	}
	sctx, cancel := context.WithCancelCause(context.Background())
	s := &Session{
		c: c, name: obj.Name, uid: obj.UID, user: user,
		ttl: cfg.ttl, margin: SafetyMargin(cfg.ttl),
		ending: ending{sctx, cancel},
	}
	// The controller counts a new session as renewed when it first sees it,
	// which is after the create was sent.
	s.deadline.extend(sent.Add(s.ttl - s.margin))
	go s.deadline.watch(c.cfg.clock, sctx.Done(), s.finishUnproven)
	go keepRenewing(sctx, c.cfg.clock, s.ttl/3, func() error {
		err := s.renew(sctx)
		if err != nil && sctx.Err() == nil {
			c.cfg.log.Info("session renewal failed; retrying", "session", s.name, "error", err.Error())
		}
		return err
	})
	c.cfg.log.V(1).Info("session created", "session", s.name, "ttl", s.ttl)
	return s, nil
}

// Name is the LockSession object's name.
func (s *Session) Name() string { return s.name }

// TTL is how long the session lives without a renewal.
func (s *Session) TTL() time.Duration { return s.ttl }

// ExpiresAt is the session's safe deadline: the send time of its last
// committed renewal plus the TTL, minus a safety margin.
func (s *Session) ExpiresAt() time.Time { return s.deadline.get() }

// renew writes status.renewTime (a merge patch: one write whatever the
// session holds). Only a committed renewal moves the safe deadline.
func (s *Session) renew(ctx context.Context) error {
	s.mu.Lock()
	now := s.c.cfg.clock.Now()
	if now.Before(s.renewedAt) { // admission refuses a renewTime that goes back
		now = s.renewedAt
	}
	s.renewedAt = now
	s.mu.Unlock()
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"renewTime": metav1.NewMicroTime(now)}})
	if err != nil {
		return err
	}
	obj := &locksv1alpha1.LockSession{ObjectMeta: metav1.ObjectMeta{Namespace: s.c.cfg.namespace, Name: s.name}}
	sent := s.c.cfg.clock.Now()
	err = s.c.c.Status().Patch(ctx, obj, client.RawPatch(types.MergePatchType, patch))
	switch {
	case err == nil:
		proven := s.deadline.get()
		s.deadline.extend(sent.Add(s.ttl - s.margin))
		s.checkLocks(int(obj.Status.Locks), proven)
		return nil
	case apierrors.IsNotFound(err):
		err = lostWith(lostSession, "session %s was deleted (closed, force-released or expired by the controller)", s.name)
	case definite(err):
		err = lostWith(lostSession, "renewing session %s was refused: %v", s.name, err)
	default:
		return fmt.Errorf("kubelock: renew session %s: %w", s.name, err)
	}
	s.cancel(err)
	return err
}

// track adds l to the session's holdings until it ends.
func (s *Session) track(l *Lock) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.locks == nil {
		s.locks = map[*Lock]struct{}{}
	}
	s.locks[l] = struct{}{}
	context.AfterFunc(l.ctx, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.locks, l)
	})
}

// checkLocks rereads the session's holdings in the background when the
// controller counts fewer of them (status.locks) than this client holds: a
// holding in a session is not renewed, so this is how its holder learns that
// one was force-released, within TTL/3 as a lock renewing itself would. The
// count lags acquisitions, so a check may find nothing; it costs reads only.
// A holding found ended keeps proven, the session's deadline before this
// renewal, as its ExpiresAt: the renewal proved the session, not the holding.
func (s *Session) checkLocks(counted int, proven time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.checking || counted >= len(s.locks) {
		return
	}
	s.checking = true
	locks := make([]*Lock, 0, len(s.locks))
	for l := range s.locks {
		locks = append(locks, l)
	}
	go func() {
		for _, l := range locks {
			l.wmu.Lock()
			if l.Err() == nil {
				l.deadline.extend(proven)
				_, _ = l.refresh(s.ctx) // ends the holding if it is no longer the holder
			}
			l.wmu.Unlock()
		}
		s.mu.Lock()
		s.checking = false
		s.mu.Unlock()
	}()
}

// finishUnproven ends the session because its safe deadline passed (I5).
func (s *Session) finishUnproven() {
	s.mu.Lock()
	s.unproven = true
	s.mu.Unlock()
	s.cancel(lostWith(lostDeadline, "could not renew session %s before its safe deadline", s.name))
}

func (s *Session) isUnproven() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.unproven && s.ctx.Err() != nil
}

// Close stops renewing, ends the session's context and every lock's in it
// (ErrSessionClosed), and deletes the session; the controller then ends its
// holdings (SessionClosed). Release the locks first to end them as Released.
// Close is idempotent; it retries the delete until ctx ends.
func (s *Session) Close(ctx context.Context) error {
	s.cancel(ErrSessionClosed)
	obj := &locksv1alpha1.LockSession{ObjectMeta: metav1.ObjectMeta{Namespace: s.c.cfg.namespace, Name: s.name}}
	back := retryBackoff()
	for {
		err := s.c.c.Delete(ctx, obj, client.Preconditions{UID: &s.uid})
		switch {
		case err == nil, apierrors.IsNotFound(err), apierrors.IsConflict(err): // a conflict: another object has the name now
			return nil
		case !retry(ctx, &back, err):
			return fmt.Errorf("kubelock: closing session %s: %w", s.name, err)
		}
	}
}

// checkSession says why a cannot acquire in its session, if it cannot.
func (a *attempt) checkSession() error {
	s := a.cfg.session
	switch {
	case s == nil:
		return nil
	case s.c.cfg.namespace != a.c.cfg.namespace:
		return fmt.Errorf("kubelock: acquire %q: session %s is in namespace %s, the lock in %s", a.key, s.name, s.c.cfg.namespace, a.c.cfg.namespace)
	case s.user != a.user:
		return fmt.Errorf("kubelock: acquire %q: session %s is user %s's, not %s's", a.key, s.name, s.user, a.user)
	case s.Err() != nil:
		return fmt.Errorf("kubelock: acquire %q in session %s, which has ended: %w", a.key, s.name, s.Err())
	}
	return nil
}
