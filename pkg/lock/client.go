package lock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/internal/escape"
	"github.com/kubelock/kubelock/internal/whoami"
)

// Client acquires locks in one namespace for one identity. It is safe for
// concurrent use; goroutines of one process waiting for the same lock share one
// place in the lock's queue.
type Client struct {
	c   client.WithWatch
	cfg config
	// who answers the SelfSubjectReview: c, except for NewDirect's.
	who client.Client

	userMu sync.Mutex
	user   string
	// podName and podUID are the pod the client's token is bound to, from the
	// same SelfSubjectReview; admission checks holdings and queue entries against it.
	podName, podUID string

	slots slots

	// gates serialise acquisitions of one key and held is the client's live
	// holding per lock name, both only WithReentrancy.
	gates  slots
	heldMu sync.Mutex
	held   map[string]*Lock

	// seen is the last object seen of each lock, where acquires start.
	seen seenLocks

	// metrics is nil unless WithMetrics was given.
	metrics *metrics
}

// New returns a client that talks to the apiserver at cfg. A request the
// apiserver's authorizer refuses while its /readyz does not pass (a restarted
// apiserver answers 403 until its RBAC rules are loaded) is sent again within
// its context, for up to 30 s; every other refusal is final at once.
func New(cfg *rest.Config, opts ...Option) (*Client, error) {
	c, err := newKubeClient(cfg)
	if err != nil {
		return nil, err
	}
	return NewFromClient(c, opts...)
}

// NewDirect returns a client whose lock requests go straight to lockAPI, the
// lock apiserver backend's kubelock-apiserver (its Service), instead of
// through kube-apiserver, which would proxy them; its one other request, the
// SelfSubjectReview that learns its user, goes to kube, which alone serves
// it. Both configs must authenticate the same user: kubelock-apiserver checks
// a token with kube-apiserver (a TokenReview, cached) and a client
// certificate against kube-apiserver's client CA. Requests are retried as
// New's are.
func NewDirect(kube, lockAPI *rest.Config, opts ...Option) (*Client, error) {
	who, err := newKubeClient(kube)
	if err != nil {
		return nil, err
	}
	c, err := newKubeClient(lockAPI)
	if err != nil {
		return nil, err
	}
	cl, err := NewFromClient(c, opts...)
	if err != nil {
		return nil, err
	}
	cl.who = who
	return cl, nil
}

// newKubeClient is a controller-runtime client of cfg for locks and
// kube-apiserver's own kinds, with New's retry of a not-ready authorizer.
func newKubeClient(cfg *rest.Config) (client.WithWatch, error) {
	if cfg == nil {
		return nil, errors.New("kubelock: rest config is nil")
	}
	cfg = rest.CopyConfig(cfg)
	if cfg.QPS == 0 && cfg.RateLimiter == nil {
		// client-go's default of 5 requests/s would hold a release or renewal
		// back behind the client's own retries until its lease runs out. The
		// apiserver bounds lock traffic with priority and fairness instead.
		cfg.QPS = -1
	}
	if err := retryWhileNotReady(cfg); err != nil {
		return nil, fmt.Errorf("kubelock: %w", err)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := locksv1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("kubelock: building a client: %w", err)
	}
	return c, nil
}

// NewFromClient returns a client on top of an existing controller-runtime
// client whose scheme knows locks.kubelock.io/v1alpha1. Its requests are
// c's: unlike New's, none is sent again while a restarted apiserver refuses
// it before its authorizer is ready.
func NewFromClient(c client.WithWatch, opts ...Option) (*Client, error) {
	if c == nil {
		return nil, errors.New("kubelock: client is nil")
	}
	cfg := defaultConfig()
	for _, o := range opts {
		o.applyToClient(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cl := &Client{c: c, who: c, cfg: cfg, slots: slots{m: map[string]*slot{}}, gates: slots{m: map[string]*slot{}}, held: map[string]*Lock{}, seen: newSeenLocks(seenLocksLimit)}
	if cfg.registerer != nil {
		m, err := newMetrics(cfg.registerer)
		if err != nil {
			return nil, fmt.Errorf("kubelock: registering the client metrics: %w", err)
		}
		cl.metrics = m
	}
	return cl, nil
}

// Namespace is the namespace of this client's locks.
func (c *Client) Namespace() string { return c.cfg.namespace }

// Identity is the holder name this client writes.
func (c *Client) Identity() string { return c.cfg.identity }

// User is the client's authenticated user name, learned once with a
// SelfSubjectReview; admission accepts no other name in holder.user.
func (c *Client) User(ctx context.Context) (string, error) {
	c.userMu.Lock()
	defer c.userMu.Unlock()
	if c.user != "" {
		return c.user, nil
	}
	info, err := whoami.New(c.who).UserInfo(ctx)
	if err != nil {
		return "", err
	}
	c.user = info.Username
	if name := info.Extra[extraPodName]; len(name) > 0 {
		c.podName = name[0]
	}
	if uid := info.Extra[extraPodUID]; len(uid) > 0 {
		c.podUID = uid[0]
	}
	return c.user, nil
}

// Extra keys of a token bound to a pod (as rules.ExtraPodName/ExtraPodUID).
const (
	extraPodName = "authentication.kubernetes.io/pod-name"
	extraPodUID  = "authentication.kubernetes.io/pod-uid"
)

// pod is the pod this client writes into holdings and queue entries: the one
// its token is bound to, as admission demands; none without a bound token.
// Call after User.
func (c *Client) pod() (name, uid string) {
	c.userMu.Lock()
	defer c.userMu.Unlock()
	return c.podName, c.podUID
}

// Get returns the lock object for key.
//
// A read the apiserver could not answer (a 5xx, a 429, a lost connection) is
// sent again, pausing as a failed write does, within ctx and for at most
// readPatience: a read changes nothing, so another try is always safe, and
// such a failure says nothing about the lock. A replica stopping behind a
// Service, an apiserver restarting behind a balancer, an etcd leader election
// each fail a read or two; a caller should not have to retry them itself, as
// it need not for acquire, renew and release. A definite answer (not found, a
// refusal) returns at once.
func (c *Client) Get(ctx context.Context, key string) (*locksv1alpha1.DistributedLock, error) {
	name, err := NameForKey(key)
	if err != nil {
		return nil, err
	}
	b, giveUp := retryBackoff(), time.Now().Add(readPatience)
	var last error
	for {
		obj, err := c.get(ctx, key, name, false)
		if err == nil || errors.Is(err, ErrNotFound) {
			return obj, err
		}
		last = keepCause(last, err)
		if errors.Is(err, errKeyCollision) || time.Now().After(giveUp) || !retry(ctx, &b, err) {
			return nil, fmt.Errorf("kubelock: reading lock %q: %w", key, last)
		}
	}
}

// readPatience bounds how long Get sends a failed read again: long enough for
// a stopping replica's endpoint to leave its Service or a restarted apiserver
// to listen again, short enough that a caller without a deadline learns of an
// outage.
const readPatience = 10 * time.Second

// get reads the lock, creating it first when allowed. Its errors but
// ErrNotFound are the apiserver's, or a lock of another key: the caller says
// what it was doing.
func (c *Client) get(ctx context.Context, key, name string, create bool) (*locksv1alpha1.DistributedLock, error) {
	obj := &locksv1alpha1.DistributedLock{}
	err := c.c.Get(ctx, client.ObjectKey{Namespace: c.cfg.namespace, Name: name}, obj)
	if apierrors.IsNotFound(err) && create {
		err = c.create(ctx, key, name, obj)
	}
	if apierrors.IsNotFound(err) {
		c.seen.forget(name)
		return nil, fmt.Errorf("%w: %s/%s (key %q); create it, or let the client create it with WithAutoCreate", ErrNotFound, c.cfg.namespace, name, key)
	}
	if err != nil {
		return nil, err
	}
	if k, ok := collidingKey(obj, key); ok {
		return nil, fmt.Errorf("%w: lock %s/%s belongs to key %q, not %q", errKeyCollision, c.cfg.namespace, name, escape.Clip(k, maxKeyLen), key)
	}
	c.seen.saw(obj)
	return obj, nil
}

func (c *Client) create(ctx context.Context, key, name string, into *locksv1alpha1.DistributedLock) error {
	obj := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{
		Namespace:   c.cfg.namespace,
		Name:        name,
		Labels:      map[string]string{locksv1alpha1.AutoCreatedLabel: "true"},
		Annotations: map[string]string{locksv1alpha1.KeyAnnotation: key},
	}}
	err := c.c.Create(ctx, obj)
	if apierrors.IsAlreadyExists(err) {
		return c.c.Get(ctx, client.ObjectKeyFromObject(obj), into)
	}
	if err == nil {
		obj.DeepCopyInto(into)
	}
	return err
}

// randomID is 128 random bits in hex, for lease and request IDs.
func randomID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b[:])
}

// definite reports whether err is an answer the apiserver gave on purpose, after
// which retrying the same write cannot help. Anything else (timeouts, lost
// connections, 5xx) leaves the outcome unknown: the write may have committed.
func definite(err error) bool {
	return apierrors.IsInvalid(err) || apierrors.IsForbidden(err) || apierrors.IsBadRequest(err) ||
		apierrors.IsUnauthorized(err) || apierrors.IsMethodNotSupported(err) || apierrors.IsNotAcceptable(err) ||
		apierrors.IsUnsupportedMediaType(err) || tooLarge(err)
}

// tooLarge reports whether a write was refused because the object would be
// larger than the apiserver's store takes: etcd's --max-request-bytes (1.5 MiB
// by default), or the gRPC limit in front of it (2 MiB). The apiserver passes
// both on as a 500 with no reason, but nothing was written and the same write
// fails again: a lock with many long holdings and a long queue can reach it
// before spec.maxWaiters does.
func tooLarge(err error) bool {
	if apierrors.IsRequestEntityTooLargeError(err) {
		return true
	}
	var st apierrors.APIStatus
	if !errors.As(err, &st) || st.Status().Code != http.StatusInternalServerError {
		return false
	}
	msg := st.Status().Message
	return strings.Contains(msg, "etcdserver: request is too large") || strings.Contains(msg, "trying to send message larger than max")
}

// retryBackoff is the pause between retries of a request: 5..15ms at first,
// doubling to 0.5..1.5s.
func retryBackoff() wait.Backoff {
	return wait.Backoff{Duration: 5 * time.Millisecond, Factor: 2, Jitter: 2, Steps: math.MaxInt32, Cap: 500 * time.Millisecond}
}

// retry pauses before another try after err, a failed request; false when
// err is a definite answer or ctx ended first.
func retry(ctx context.Context, b *wait.Backoff, err error) bool {
	return !definite(err) && pause(ctx, b) == nil
}

// pause waits for b's next step, or until ctx ends.
func pause(ctx context.Context, b *wait.Backoff) error {
	t := time.NewTimer(b.Step())
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// writeStatus writes l's status, stamped with the generation it saw and with
// its counts in step with its lists (a lock an earlier release stored may lack
// one), as every write of a lock user must be.
//
// It sends no managedFields: for a status write the apiserver's field
// manager keeps the stored object's whatever the request carries, so they
// would be a kilobyte it decodes and throws away on every write.
func (c *Client) writeStatus(ctx context.Context, l *locksv1alpha1.DistributedLock) error {
	l.Status.ObservedGeneration = l.Generation
	l.SyncCounts()
	l.ManagedFields = nil
	return c.c.Status().Update(ctx, l)
}
