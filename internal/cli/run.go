package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
)

// Environment variables run gives its command.
const (
	EnvFencingToken = "KUBELOCK_FENCING_TOKEN"
	EnvLeaseID      = "KUBELOCK_LEASE_ID"
	EnvLock         = "KUBELOCK_LOCK" // namespace/name of the lock object
	EnvKey          = "KUBELOCK_KEY"
)

// forwarded are the signals run passes on to its command's process group.
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP}

func newRunCommand(o *options) *cobra.Command {
	var (
		f       acquireFlags
		grace   time.Duration
		session bool
	)
	cmd := &cobra.Command{
		Use:   "run KEY [flags] -- CMD [ARGS...]",
		Short: "Hold a lock while a command runs; stop the command if the lock is lost",
		Long: `Take the lock for KEY (waiting up to --wait), then run CMD in its own process
group with ` + EnvFencingToken + `, ` + EnvLeaseID + `, ` + EnvLock + ` (namespace/name) and
` + EnvKey + ` in its environment, renewing the lease while it runs. The lock is
held in a session of its own (a LockSession with the lease as its TTL, closed
after the release); --session=false renews the lock itself, for clusters
without the LockSession kind or RBAC for it.

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
  kubelock run orders-db --lease 30s --grace 5s -- sh -c 'migrate --token "$KUBELOCK_FENCING_TOKEN"'`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.ArgsLenAtDash() != 1 || len(args) < 2 {
				return usageErrorf("expected KEY -- CMD [ARGS...]")
			}
			if err := f.check(args[0]); err != nil {
				return err
			}
			if grace < 0 {
				return usageErrorf("--grace must not be negative, got %s", grace)
			}
			return o.run(cmd.Context(), args[0], args[1:], &f, grace, session)
		},
	}
	f.add(cmd.Flags(), lock.DefaultMaxWait, true)
	addSessionFlag(cmd, &session)
	cmd.Flags().DurationVar(&grace, "grace", 10*time.Second, "how long the command's process group has after SIGTERM before SIGKILL (never beyond the lease's safe deadline)")
	return cmd
}

func (o *options) run(ctx context.Context, key string, argv []string, f *acquireFlags, grace time.Duration, session bool) error {
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return withCode(ExitCommandNotFound, errorf("command %q: %w", argv[0], err))
	}
	var extra []lock.Option
	if f.create {
		extra = append(extra, lock.WithAutoCreate())
	}
	c, err := o.lockClient(extra...)
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
		if sess, err = o.openSession(actx, c, key, f.lease); err == nil {
			defer o.closeSession(sess) // after the release below
		}
	}
	var l *lock.Lock
	if err == nil {
		l, err = f.acquire(actx, c, key, o.streams.ErrOut, lock.InSession(sess))
	}
	cancel()
	if err != nil {
		if interrupted != nil {
			return signalExit(interrupted)
		}
		return err
	}

	g, err := startGroup(path, argv, append(os.Environ(),
		EnvFencingToken+"="+strconv.FormatInt(l.FencingToken(), 10),
		EnvLeaseID+"="+l.LeaseID(),
		EnvLock+"="+c.Namespace()+"/"+l.Name(),
		EnvKey+"="+l.Key(),
	), o.streams)
	if err != nil {
		o.releaseOrWarn(l)
		return withCode(ExitCommandNotExecutable, errorf("starting %q: %w", argv[0], err))
	}

	defer g.finish()
	var (
		lostErr  error
		lost     = l.Done() // nil once handled: a closed channel is always ready
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
			if !errors.Is(context.Cause(l.Context()), lock.ErrReleased) {
				lostErr = context.Cause(l.Context())
				now := time.Now()
				deadline = graceUntil(now, grace, l.ExpiresAt())
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
			deadline = graceUntil(now, grace, l.ExpiresAt())
			_, _ = fmt.Fprintf(o.streams.ErrOut, "kubelock: %q exited and left processes in its group; sending them SIGTERM (SIGKILL in %s)\n",
				argv[0], deadline.Sub(now).Round(time.Millisecond))
			g.signal(syscall.SIGTERM)
		}
		g.drain(deadline)
	}
	g.finish()
	if lostErr != nil {
		return withCode(ExitLockLost, nil)
	}
	if err := o.releaseLock(l); err != nil {
		if errors.Is(err, lock.ErrLockLost) {
			// The holding ended before the command finished: its work may have
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

// openSession creates the session run or sidecar holds its lock in. Its TTL
// is the lease the lock would get without one: --lease, else the lock's
// spec.leaseDurationSeconds, else the default; at least the shortest TTL.
func (o *options) openSession(ctx context.Context, c *lock.Client, key string, lease time.Duration) (*lock.Session, error) {
	if lease == 0 {
		lease = lock.DefaultSessionTTL
		if obj, err := c.Get(ctx, key); err == nil && obj.Spec.LeaseDurationSeconds > 0 {
			lease = time.Duration(obj.Spec.LeaseDurationSeconds) * time.Second
		}
	}
	s, err := c.NewSession(ctx, lock.SessionTTL(max(lease, locksv1alpha1.MinSessionTTLSeconds*time.Second)))
	if err != nil {
		return nil, fmt.Errorf("%w (without the LockSession kind or RBAC for it, pass --session=false)", err)
	}
	return s, nil
}

// closeSession deletes s after its lock was released.
func (o *options) closeSession(s *lock.Session) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Close(ctx); err != nil {
		_, _ = fmt.Fprintf(o.streams.ErrOut, "%s; the session will lapse after its TTL\n", oneLine(err))
	}
}

func (o *options) releaseLock(l *lock.Lock) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return l.Release(ctx)
}

func (o *options) releaseOrWarn(l *lock.Lock) {
	if err := o.releaseLock(l); err != nil {
		o.warnRelease(err)
	}
}

func (o *options) warnRelease(err error) {
	_, _ = fmt.Fprintf(o.streams.ErrOut, "%s; release failed, the lease will expire\n", oneLine(err))
}
