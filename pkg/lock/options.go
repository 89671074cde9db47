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

// Defaults of the options.
const (
	// DefaultNamespace is used when neither WithNamespace nor POD_NAMESPACE says otherwise.
	DefaultNamespace = "default"
	// DefaultWaitTimeout is how long an Acquire may wait in a queue unless
	// WithWaitTimeout says otherwise.
	DefaultWaitTimeout = time.Hour
	// DefaultSessionTTL is a session's TTL unless WithTTL says otherwise.
	DefaultSessionTTL = locksv1alpha1.DefaultSessionTTLSeconds * time.Second
)

// tryTimeout bounds a TryAcquire whose context has no deadline, while it
// retries after lost connections (it never waits for the lock itself).
const tryTimeout = 30 * time.Second

// An Option configures a Client: pass it to New or NewFromClient.
type Option interface{ applyToClient(*config) }

// An AcquireOption configures one call of Acquire, TryAcquire or AcquireAll.
type AcquireOption interface{ applyToAcquire(*acquireConfig) }

// A DefaultOption is both: given to New it sets the client's default for
// every call, given to one call it overrides that default for the call.
type DefaultOption interface {
	Option
	AcquireOption
}

type clientOption func(*config)

func (o clientOption) applyToClient(c *config) { o(c) }

type acquireOption func(*acquireConfig)

func (o acquireOption) applyToAcquire(a *acquireConfig) { o(a) }

// defaultOption sets a call's field, or the client's default of it.
type defaultOption func(*acquireConfig)

func (o defaultOption) applyToClient(c *config)         { o(&c.call) }
func (o defaultOption) applyToAcquire(a *acquireConfig) { o(a) }

type config struct {
	namespace  string
	identity   string
	autoCreate bool
	autoRenew  bool
	log        logr.Logger
	clock      clock.WithTicker
	registerer prometheus.Registerer
	reentrant  bool
	// call holds the defaults of every call (DefaultOption); its waitTimeout
	// also bounds a call's.
	call acquireConfig
}

type acquireConfig struct {
	requestID   string
	waitTimeout time.Duration
	lease       time.Duration
	onQueue     func(QueueStatus)
	session     *Session
	shared      bool
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
		autoRenew: true,
		log:       logr.Discard(),
		clock:     clock.RealClock{},
		call:      acquireConfig{waitTimeout: DefaultWaitTimeout},
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
	if err := validateLease(c.call.lease, true); err != nil {
		return err
	}
	if c.call.waitTimeout <= 0 {
		return fmt.Errorf("kubelock: the wait timeout must be positive, got %s", c.call.waitTimeout)
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
func WithNamespace(ns string) Option { return clientOption(func(c *config) { c.namespace = ns }) }

// WithIdentity sets the holder's human-friendly name (default: POD_NAME, else the hostname).
func WithIdentity(id string) Option { return clientOption(func(c *config) { c.identity = id }) }

// WithAutoCreate creates a lock object on first use, labelled auto-created so
// the controller removes it once idle. Default: off, and a missing lock is ErrNotFound.
func WithAutoCreate() Option { return clientOption(func(c *config) { c.autoCreate = true }) }

// WithoutAutoRenew turns background renewal off; the caller must call Renew.
func WithoutAutoRenew() Option { return clientOption(func(c *config) { c.autoRenew = false }) }

// WithLogger sets the logger (default: discard).
func WithLogger(l logr.Logger) Option { return clientOption(func(c *config) { c.log = l }) }

// WithMetrics records the client's metrics (kubelock_client_*: operation
// durations and outcomes, wait and hold times, lost locks by cause, retried
// conflicts, holdings) in reg. Clients sharing reg share the series. Default:
// no metrics, and no cost on the lock paths.
func WithMetrics(reg prometheus.Registerer) Option {
	return clientOption(func(c *config) { c.registerer = reg })
}

// WithReentrancy makes the client's holdings reentrant: acquiring a key the
// client already holds in the same mode returns the same *Lock with its hold count raised (no write), and
// Release lowers the count, releasing the lock at zero. Every re-entry shares
// the token, Context and Done, so a lost lock ends them all. Acquiring a held
// key in the other mode returns ErrMode: no upgrade, no downgrade, never a
// wait for oneself. A re-entry keeps the first acquisition's options (lease,
// session, request ID). Default: off, and a second Acquire of a held key
// waits for its release, as sync.Mutex does.
func WithReentrancy() Option { return clientOption(func(c *config) { c.reentrant = true }) }

// withClock sets the clock of deadlines and renew timers; the package's tests
// step it by hand.
func withClock(clk clock.WithTicker) Option { return clientOption(func(c *config) { c.clock = clk }) }

// WithLeaseDuration sets the lease asked for (whole seconds, 1s..1h).
// Default: the lock's spec.leaseDurationSeconds. A holding in a session
// has the session's TTL as its lease instead.
func WithLeaseDuration(d time.Duration) DefaultOption {
	return defaultOption(func(a *acquireConfig) { a.lease = d })
}

// WithWaitTimeout bounds how long Acquire and AcquireAll wait in the queue.
// A client's is the default and the upper bound of its calls'. Default:
// DefaultWaitTimeout.
func WithWaitTimeout(d time.Duration) DefaultOption {
	return defaultOption(func(a *acquireConfig) { a.waitTimeout = d })
}

// WithSession acquires in session s: the holding and any queue entry name s,
// the lease is s's TTL (WithLeaseDuration is ignored), the lock runs no
// renewal of its own, and its Context is a child of s's, so it ends when s
// does. s must be of the client's namespace and user. On one call,
// WithSession(nil) acquires without the client's session. Default: no
// session: a Client creates none by itself.
func WithSession(s *Session) DefaultOption {
	return defaultOption(func(a *acquireConfig) { a.session = s })
}

// WithRequestID sets the idempotency key of the call. Retrying with the same
// ID never creates a second holding: it returns the same lease while it
// lasts, or reports that it already ended. Default: a fresh random ID per
// call. A retry from another call or process is recognised while its holding
// is among the last MaxRecentAcquisitions the lock remembers; within one
// call, Acquire refuses (ErrLockLost) rather than guess once the lock changed
// hands more often. A call that gives up (its ctx ended, or its wait timed
// out) ends a holding of its own whose answer it lost, so a retry after
// that reports it ended. Every lock user of the namespace reads request IDs in
// the lock's status, and one nobody has used yet is anyone's: choose one
// nobody can guess (a Job's UID rather than its name), or another user may
// take it first.
func WithRequestID(id string) AcquireOption {
	return acquireOption(func(a *acquireConfig) { a.requestID = id })
}

// WithQueueCallback calls f each time a waiting Acquire learns that its place
// in the queue, the queue's length or the holder changed (for progress
// displays such as the CLI's live waiting line). f runs on the acquiring
// goroutine and must return quickly; TryAcquire never calls it. Default: no
// callback.
func WithQueueCallback(f func(QueueStatus)) AcquireOption {
	return acquireOption(func(a *acquireConfig) { a.onQueue = f })
}

// WithShared acquires the lock shared: as one of an RWMutex's readers, who
// hold it together while no writer does. A Semaphore is always acquired
// shared, on the lowest free permit (Lock.Slot), with or without this option;
// a Mutex cannot be, and Acquire returns ErrMode. Default: exclusive (a
// Mutex's holder, an RWMutex's writer).
func WithShared() AcquireOption { return acquireOption(func(a *acquireConfig) { a.shared = true }) }

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

// acquireConfig is the client's defaults with opts applied, checked.
func (c *Client) acquireConfig(opts []AcquireOption) (acquireConfig, error) {
	a := c.cfg.call
	for _, o := range opts {
		o.applyToAcquire(&a)
	}
	if a.requestID == "" {
		a.requestID = randomID()
	}
	if len(a.requestID) > 64 {
		return a, fmt.Errorf("kubelock: request ID is %d characters long; the limit is 64", len(a.requestID))
	}
	if bound := c.cfg.call.waitTimeout; a.waitTimeout <= 0 || a.waitTimeout > bound {
		return a, fmt.Errorf("kubelock: wait timeout %s is outside 0..%s (raise the client's WithWaitTimeout)", a.waitTimeout, bound)
	}
	if a.session != nil {
		a.lease = a.session.ttl
		return a, nil
	}
	return a, validateLease(a.lease, true)
}
