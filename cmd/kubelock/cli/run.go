package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
)

// Environment variables run gives its command. With several locks (--lock
// more than once) each gets a suffix _1.._N in the order given, and
// EnvLockCount says N.
const (
	EnvFencingToken = "KUBELOCK_FENCING_TOKEN"
	EnvLeaseID      = "KUBELOCK_LEASE_ID"
	EnvLock         = "KUBELOCK_LOCK" // namespace/name of the lock object
	EnvKey          = "KUBELOCK_KEY"
	// EnvSlot is a shared holding's permit (a Semaphore's, an RWMutex
	// reader's); absent for an exclusive one. A resource fences per slot.
	EnvSlot      = "KUBELOCK_SLOT"
	EnvLockCount = "KUBELOCK_LOCK_COUNT"
)

// forwarded are the signals run passes on to its command's process group.
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP}

func newRunCommand(o *options) *cobra.Command {
	var (
		f       acquireFlags
		grace   time.Duration
		session bool
		locks   []string
	)
	cmd := &cobra.Command{
		Use:   "run (KEY | --lock KEY...) [flags] -- CMD [ARGS...]",
		Short: "Hold a lock (or several, all or nothing) while a command runs; stop the command if one is lost",
		Long: `Take the lock for KEY (waiting up to --wait), then run CMD in its own process
group with ` + EnvFencingToken + `, ` + EnvLeaseID + `, ` + EnvLock + ` (namespace/name),
` + EnvKey + ` and, for a shared holding (a Semaphore's permit, an RWMutex's
reader with --shared), ` + EnvSlot + ` in its environment, renewing the lease while
it runs. The lock is held in a session of its own (a LockSession with the
lease as its TTL, closed after the release); --session=false renews the lock
itself, for clusters without the LockSession kind or RBAC for it.

With --lock given more than once, take every lock, all or nothing: in a
canonical order (by object name, so two runs taking the same locks in any
order never deadlock), within one --wait for all of them; if one cannot be
taken, the ones taken are released and CMD does not run. The variables above
then carry a suffix _1, _2, ... in the order of the --lock flags, and
` + EnvLockCount + ` says how many there are. --shared applies to every lock.
The command is stopped when any of them is lost.

SIGINT, SIGTERM and SIGHUP are forwarded to the whole process group. If the
lock is lost, the whole group (the command and everything it started) gets
SIGTERM, and SIGKILL after --grace or when the lease's safe deadline passes,
whichever comes first; run then exits with 75. When CMD exits by itself,
whatever it left running in its group is stopped the same way before the lock
is released, so nothing of CMD runs unprotected. run exits with CMD's exit code
(128+N if signal N ended it). On Linux the group never outlives run: a small
guard process (kubelock itself) starts CMD and SIGKILLs the group as soon as
run dies, even by SIGKILL; the lease then expires. Processes that leave the
group (setsid, double-fork daemons) are not followed.`,
		Example: `  kubelock run nightly-report --wait 10m -- ./report.sh --full
  kubelock run orders-db --lease 30s --grace 5s -- sh -c 'migrate --token "$KUBELOCK_FENCING_TOKEN"'
  kubelock run catalog --shared -- ./export.sh          # one of an RWMutex's readers
  kubelock run indexers -- sh -c 'index --shard "$KUBELOCK_SLOT"'   # a Semaphore's permit
  kubelock run --lock orders-db --lock stock-db -- ./transfer.sh   # both, all or nothing`,
		RunE: func(cmd *cobra.Command, args []string) error {
			dash := cmd.ArgsLenAtDash()
			if dash < 0 || dash > 1 || len(args) <= dash || dash+len(locks) == 0 {
				return usageErrorf("expected KEY -- CMD [ARGS...] or --lock KEY [--lock KEY...] -- CMD [ARGS...]")
			}
			keys := slices.Concat(args[:dash], locks)
			for _, key := range keys {
				if err := f.check(key); err != nil {
					return err
				}
			}
			switch {
			case grace < 0:
				return usageErrorf("--grace must not be negative, got %s", grace)
			case len(keys) > 1 && f.wait == 0:
				return usageErrorf("--wait 0 (try once) takes one lock; several are taken within one --wait above 0")
			}
			return o.run(cmd.Context(), keys, args[dash:], &f, grace, session)
		},
	}
	f.add(cmd.Flags(), lock.DefaultWaitTimeout, true)
	addSessionFlag(cmd, &session)
	cmd.Flags().DurationVar(&grace, "grace", 10*time.Second, "how long the command's process group has after SIGTERM before SIGKILL (never beyond the lease's safe deadline)")
	cmd.Flags().StringArrayVar(&locks, "lock", nil, "a lock to hold (repeat for several: all are taken, or none)")
	return cmd
}

// held is what run holds while its command runs: one lock, or several taken
// together (all, from AcquireAll).
type held struct {
	locks []*lock.Lock
	all   *lock.Locks
}

// Context ends when any holding ends.
func (h held) Context() context.Context {
	if h.all != nil {
		return h.all.Context()
	}
	return h.locks[0].Context()
}

func (h held) Release(ctx context.Context) error {
	if h.all != nil {
		return h.all.Release(ctx)
	}
	return h.locks[0].Release(ctx)
}

// ExpiresAt is the soonest end of a lease: the command must be gone by then.
func (h held) ExpiresAt() time.Time {
	t := h.locks[0].ExpiresAt()
	for _, l := range h.locks[1:] {
		if e := l.ExpiresAt(); e.Before(t) {
			t = e
		}
	}
	return t
}

// env is what the command learns of its holdings (the Env* variables).
func (h held) env(ns string) []string {
	one := func(suffix string, l *lock.Lock) []string {
		vars := []string{
			EnvFencingToken + suffix + "=" + strconv.FormatInt(l.FencingToken(), 10),
			EnvLeaseID + suffix + "=" + l.LeaseID(),
			EnvLock + suffix + "=" + ns + "/" + l.Name(),
			EnvKey + suffix + "=" + l.Key(),
		}
		if slot, shared := l.Slot(); shared {
			vars = append(vars, EnvSlot+suffix+"="+strconv.Itoa(int(slot)))
		}
		return vars
	}
	if len(h.locks) == 1 {
		return one("", h.locks[0])
	}
	vars := []string{EnvLockCount + "=" + strconv.Itoa(len(h.locks))}
	for i, l := range h.locks {
		vars = append(vars, one("_"+strconv.Itoa(i+1), l)...)
	}
	return vars
}

// take acquires keys for run: one with f.acquire (TryAcquire with --wait 0,
// the live waiting line), several with AcquireAll.
func (f *acquireFlags) take(ctx context.Context, c *lock.Client, keys []string, errOut io.Writer, opts ...lock.AcquireOption) (held, error) {
	if len(keys) == 1 {
		l, err := f.acquire(ctx, c, keys[0], errOut, opts...)
		return held{locks: []*lock.Lock{l}}, err
	}
	p := newProgress(errOut, strings.Join(keys, ", "), f.progress)
	defer p.done()
	all, err := c.AcquireAll(ctx, keys, f.options(append(opts, lock.WithWaitTimeout(f.wait), lock.WithQueueCallback(p.update))...)...)
	if err != nil {
		return held{}, err
	}
	return held{locks: all.Locks(), all: all}, nil
}

func (o *options) run(ctx context.Context, keys, argv []string, f *acquireFlags, grace time.Duration, session bool) error {
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return withCode(ExitCommandNotFound, errorf("command %q: %w", argv[0], err))
	}
	c, err := f.client(ctx, o)
	if err != nil {
		return err
	}
	// Signals are caught from here on: during the wait they cancel it, later
	// they go to the command.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)

	actx, cancel := context.WithCancel(ctx)
	var interrupted os.Signal
	go func() {
		select {
		case s := <-sigs:
			interrupted = s
			cancel()
		case <-actx.Done():
		}
	}()
	var sess *lock.Session
	if session {
		if sess, err = o.openSession(actx, c, keys, f.lease); err == nil {
			defer o.closeSession(sess) // after the release below
		}
	}
	var h held
	if err == nil {
		h, err = f.take(actx, c, keys, o.streams.ErrOut, lock.WithSession(sess))
	}
	cancel()
	if err != nil {
		if interrupted != nil {
			return signalExit(interrupted)
		}
		return err
	}

	g, err := startGroup(path, argv, append(os.Environ(), h.env(c.Namespace())...), o.streams)
	if err != nil {
		o.releaseOrWarn(h)
		return withCode(ExitCommandNotExecutable, errorf("starting %q: %w", argv[0], err))
	}

	defer g.finish()
	var (
		lostErr  error
		lost     = h.Context().Done() // nil once handled: a closed channel is always ready
		killAt   <-chan time.Time
		deadline time.Time // when the group gets SIGKILL, once it got SIGTERM
	)
	for done := false; !done; {
		select {
		case s := <-sigs:
			if sig, ok := s.(syscall.Signal); ok {
				g.signal(sig)
			}
		case <-lost:
			lost = nil
			if !errors.Is(context.Cause(h.Context()), lock.ErrReleased) {
				lostErr = context.Cause(h.Context())
				now := time.Now()
				deadline = graceUntil(now, grace, h.ExpiresAt())
				_, _ = fmt.Fprintf(o.streams.ErrOut, "%s; sending SIGTERM to %q and its process group (SIGKILL in %s)\n",
					oneLine(lostErr), argv[0], deadline.Sub(now).Round(time.Millisecond))
				g.signal(syscall.SIGTERM)
				killAt = time.After(deadline.Sub(now))
			}
		case <-killAt:
			g.signal(syscall.SIGKILL)
		case <-g.exited:
			done = true
		}
	}
	// The command is gone; stop what it left in its group before the lock goes.
	if g.alive() {
		if lostErr == nil {
			now := time.Now()
			deadline = graceUntil(now, grace, h.ExpiresAt())
			_, _ = fmt.Fprintf(o.streams.ErrOut, "kubelock: %q exited and left processes in its group; sending them SIGTERM (SIGKILL in %s)\n",
				argv[0], deadline.Sub(now).Round(time.Millisecond))
			g.signal(syscall.SIGTERM)
		}
		g.drain(deadline)
	}
	g.finish()
	if lostErr != nil {
		if h.all != nil {
			// The others are still held; the lost one's ErrLockLost is no news.
			_ = cleanup(h.Release)
		}
		return withCode(ExitLockLost, nil)
	}
	if err := cleanup(h.Release); err != nil {
		if errors.Is(err, lock.ErrLockLost) {
			// A holding ended before the command finished: its work may have
			// overlapped with the next holder's.
			return withCode(ExitLockLost, err)
		}
		o.warnRelease(err)
	}
	return g.exitCode()
}

// addSessionFlag adds --session, which run and sidecar share.
func addSessionFlag(cmd *cobra.Command, on *bool) {
	cmd.Flags().BoolVar(on, "session", true, "hold the lock in a LockSession renewed once for the process (TTL = the lease); false renews the lock itself, for clusters without the LockSession kind or RBAC for it")
}

// openSession creates the session run or sidecar holds its locks in. Its
// TTL is the lease the locks would get without one: --lease, else the
// shortest spec.leaseDurationSeconds of the locks, else the default; at least
// the shortest TTL.
func (o *options) openSession(ctx context.Context, c *lock.Client, keys []string, lease time.Duration) (*lock.Session, error) {
	if lease == 0 {
		for _, key := range keys {
			if obj, err := c.Get(ctx, key); err == nil && obj.Spec.LeaseDurationSeconds > 0 {
				if d := time.Duration(obj.Spec.LeaseDurationSeconds) * time.Second; lease == 0 || d < lease {
					lease = d
				}
			}
		}
		if lease == 0 {
			lease = lock.DefaultSessionTTL
		}
	}
	s, err := c.NewSession(ctx, lock.WithTTL(max(lease, locksv1alpha1.MinSessionTTLSeconds*time.Second)))
	if err != nil {
		return nil, fmt.Errorf("%w (without the LockSession kind or RBAC for it, pass --session=false)", err)
	}
	return s, nil
}

// closeSession deletes s after its lock was released.
func (o *options) closeSession(s *lock.Session) {
	if err := cleanup(s.Close); err != nil {
		_, _ = fmt.Fprintf(o.streams.ErrOut, "%s; the session will lapse after its TTL\n", oneLine(err))
	}
}

// cleanup runs a release or close with a bound of its own: it must happen
// after an interrupt too.
func cleanup(f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return f(ctx)
}

// releaseOrWarn releases l (a lock, or what run holds) and warns when that fails.
func (o *options) releaseOrWarn(l interface{ Release(context.Context) error }) {
	if err := cleanup(l.Release); err != nil {
		o.warnRelease(err)
	}
}

func (o *options) warnRelease(err error) {
	_, _ = fmt.Fprintf(o.streams.ErrOut, "%s; release failed, the lease will expire\n", oneLine(err))
}
