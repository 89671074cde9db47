package lock

import (
	"fmt"
	"os"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/clock"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// Defaults of the client options.
const (
	// DefaultNamespace is used when neither WithNamespace nor POD_NAMESPACE says otherwise.
	DefaultNamespace = "default"
	// DefaultMaxWait bounds how long any Acquire may wait in a queue.
	DefaultMaxWait = time.Hour
	// DefaultTryTimeout bounds a TryAcquire whose context has no deadline, while
	// it retries after lost connections (it never waits for the lock itself).
	DefaultTryTimeout = 30 * time.Second
)

// Option configures a Client.
type Option func(*config)

type config struct {
	namespace     string
	identity      string
	leaseDuration time.Duration
	maxWait       time.Duration
	autoCreate    bool
	autoRenew     bool
	log           logr.Logger
	clock         clock.WithTicker
	registerer    prometheus.Registerer
	session       *Session
	reentrant     bool
}

func defaultConfig() config {
	ns := os.Getenv("POD_NAMESPACE")
	if ns == "" {
		ns = DefaultNamespace
	}
	identity := os.Getenv("POD_NAME")
	if identity == "" {
		identity, _ = os.Hostname()
	}
	return config{
		namespace: ns,
		identity:  identity,
		maxWait:   DefaultMaxWait,
		autoRenew: true,
		log:       logr.Discard(),
		clock:     clock.RealClock{},
	}
}

func (c *config) validate() error {
	if errs := validation.IsDNS1123Label(c.namespace); len(errs) > 0 {
		return fmt.Errorf("kubelock: namespace %q is invalid: %s", c.namespace, errs[0])
	}
	if c.identity == "" {
		return fmt.Errorf("kubelock: identity is empty: set WithIdentity, POD_NAME or a hostname")
	}
	if len(c.identity) > 253 {
		return fmt.Errorf("kubelock: identity is %d characters long; the limit is 253", len(c.identity))
	}
	if err := validateLease(c.leaseDuration, true); err != nil {
		return err
	}
	if c.maxWait <= 0 {
		return fmt.Errorf("kubelock: the maximum wait must be positive, got %s", c.maxWait)
	}
	return nil
}

func validateLease(d time.Duration, zeroOK bool) error {
	if d == 0 && zeroOK {
		return nil
	}
	if d < time.Second || d > locksv1alpha1.MaxLeaseDurationSeconds*time.Second || d%time.Second != 0 {
		return fmt.Errorf("kubelock: lease duration must be whole seconds within 1s..%ds, got %s", locksv1alpha1.MaxLeaseDurationSeconds, d)
	}
	return nil
}

// WithNamespace sets the namespace of the lock objects (default: POD_NAMESPACE, else "default").
func WithNamespace(ns string) Option { return func(c *config) { c.namespace = ns } }

// WithIdentity sets the holder's human-friendly name (default: POD_NAME, else the hostname).
func WithIdentity(id string) Option { return func(c *config) { c.identity = id } }

// WithPod has no effect. A client writes into holdings and queue entries the
// pod its token is bound to (the token the kubelet mounts in a pod is), and no
// pod with any other token: admission accepts pod fields only from a token
// bound to that very pod.
//
// Deprecated: the pod comes from the client's token.
func WithPod(name, uid string) Option { return func(*config) {} }

// WithLeaseDuration sets the lease asked for (whole seconds, 1s..1h). Default: the lock's spec.leaseDurationSeconds.
func WithLeaseDuration(d time.Duration) Option { return func(c *config) { c.leaseDuration = d } }

// WithMaxWait bounds every WaitTimeout (default DefaultMaxWait).
func WithMaxWait(d time.Duration) Option { return func(c *config) { c.maxWait = d } }

// WithAutoCreate creates a lock object on first use, labelled auto-created so
// the controller removes it once idle. Default: off, and a missing lock is ErrNotFound.
func WithAutoCreate() Option { return func(c *config) { c.autoCreate = true } }

// WithoutAutoRenew turns background renewal off; the caller must call Renew.
func WithoutAutoRenew() Option { return func(c *config) { c.autoRenew = false } }

// WithLogger sets the logger (default: discard).
func WithLogger(l logr.Logger) Option { return func(c *config) { c.log = l } }

// WithMetrics records the client's metrics (kubelock_client_*: operation
// durations and outcomes, wait and hold times, lost locks by cause, retried
// conflicts, holdings) in reg. Clients sharing reg share the series. Default:
// no metrics, and no cost on the lock paths.
func WithMetrics(reg prometheus.Registerer) Option { return func(c *config) { c.registerer = reg } }

// WithReentrancy makes the client's holdings reentrant, as the seed's Redis
// hash of client → hold count: acquiring a key the client already holds in the
// same mode returns the same *Lock with its hold count raised (no write), and
// Release lowers the count, releasing the lock at zero. Every re-entry shares
// the token, Context and Done, so a lost lock ends them all. Acquiring a held
// key in the other mode returns ErrMode: no upgrade, no downgrade, never a
// wait for oneself. A re-entry keeps the first acquisition's options (lease,
// session, request ID). Default: off, and a second Acquire of a held key
// waits for its release, as sync.Mutex does.
func WithReentrancy() Option { return func(c *config) { c.reentrant = true } }

// withClock sets the clock of deadlines and renew timers; the package's tests
// step it by hand.
func withClock(clk clock.WithTicker) Option { return func(c *config) { c.clock = clk } }

// AcquireOption configures one Acquire or TryAcquire call.
type AcquireOption func(*acquireConfig)

type acquireConfig struct {
	requestID   string
	waitTimeout time.Duration
	lease       time.Duration
	onQueue     func(QueueStatus)
	session     *Session
	shared      bool
}

// QueueStatus is where a waiting Acquire stands in the lock's wait queue.
type QueueStatus struct {
	// Position is the caller's 1-based place in the queue; 1 is the head.
	Position int
	// Waiters is the length of the queue.
	Waiters int
	// Holder is the current exclusive holding; nil while the lock is free or
	// held only shared.
	Holder *locksv1alpha1.LockHolder
	// Holdings is how many hold the lock now, exclusive and shared.
	Holdings int
}

// RequestID sets the idempotency key of the call. Retrying with the same ID never
// creates a second holding: it returns the same lease while it lasts, or reports
// that it already ended. Default: a fresh random ID per call. A retry from
// another call or process is recognised while its holding is among the last
// MaxRecentAcquisitions the lock remembers; within one call, Acquire refuses
// (ErrLockLost) rather than guess once the lock changed hands more often.
// Every lock user of the namespace reads request IDs in the lock's status,
// and one nobody has used yet is anyone's: choose one nobody can guess (a
// Job's UID rather than its name), or another user may take it first.
func RequestID(id string) AcquireOption { return func(a *acquireConfig) { a.requestID = id } }

// WaitTimeout bounds how long Acquire waits in the queue (default and upper bound: the client's WithMaxWait).
func WaitTimeout(d time.Duration) AcquireOption { return func(a *acquireConfig) { a.waitTimeout = d } }

// OnQueue calls f each time a waiting Acquire learns that its place in the
// queue, the queue's length or the holder changed (for progress displays such
// as the CLI's live waiting line). f runs on the acquiring goroutine and must
// return quickly; it is never called by TryAcquire. Default: no callback.
func OnQueue(f func(QueueStatus)) AcquireOption { return func(a *acquireConfig) { a.onQueue = f } }

// Shared acquires the lock shared: as one of an RWMutex's readers, who hold
// it together while no writer does. A Semaphore is always acquired shared, on
// the lowest free permit (Lock.Slot), with or without this option; a Mutex
// cannot be, and Acquire returns ErrMode. Default: exclusive (a Mutex's
// holder, an RWMutex's writer).
func Shared() AcquireOption { return func(a *acquireConfig) { a.shared = true } }

// LeaseDuration overrides the client's lease for this acquisition.
func LeaseDuration(d time.Duration) AcquireOption { return func(a *acquireConfig) { a.lease = d } }

func (c *Client) acquireConfig(opts []AcquireOption) (acquireConfig, error) {
	a := acquireConfig{waitTimeout: c.cfg.maxWait, lease: c.cfg.leaseDuration, session: c.cfg.session}
	for _, o := range opts {
		o(&a)
	}
	if a.requestID == "" {
		a.requestID = randomID()
	}
	if len(a.requestID) > 64 {
		return a, fmt.Errorf("kubelock: request ID is %d characters long; the limit is 64", len(a.requestID))
	}
	if a.waitTimeout <= 0 || a.waitTimeout > c.cfg.maxWait {
		return a, fmt.Errorf("kubelock: wait timeout %s is outside 0..%s (raise it with WithMaxWait)", a.waitTimeout, c.cfg.maxWait)
	}
	if a.session != nil {
		a.lease = a.session.ttl
		return a, nil
	}
	return a, validateLease(a.lease, true)
}
