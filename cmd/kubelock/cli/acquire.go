package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/wait"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
)

// acquireFlags are the flags of every command that takes a lock.
type acquireFlags struct {
	wait      time.Duration
	lease     time.Duration
	requestID string
	create    bool
	progress  string
	shared    bool
}

func (f *acquireFlags) add(flags *pflag.FlagSet, defaultWait time.Duration, withRequestID bool) {
	flags.DurationVar(&f.wait, "wait", defaultWait, fmt.Sprintf("how long to wait in the lock's queue; 0 tries once and fails if the lock is taken (at most %s)", lock.DefaultWaitTimeout))
	flags.DurationVar(&f.lease, "lease", 0, "lease to ask for, in whole seconds (default: the lock's spec.leaseDurationSeconds)")
	flags.BoolVar(&f.create, "create", false, "create the lock on first use (labelled auto-created; the controller deletes it once idle)")
	flags.StringVar(&f.progress, "progress", "auto", "live waiting line on stderr: auto (only on a terminal), always or never")
	flags.BoolVar(&f.shared, "shared", false, "hold the lock shared: an RWMutex as one of its readers (a Semaphore's permits are always shared; a Mutex cannot be)")
	if withRequestID {
		flags.StringVar(&f.requestID, "request-id", "", "idempotency key: retrying with the same ID returns the same lease instead of a second one (default: random; every lock user can read it, so choose one nobody can guess, such as a Job's UID)")
	}
}

func (f *acquireFlags) check(key string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if err := checkWait(f.wait); err != nil {
		return err
	}
	if err := checkLease(f.lease); err != nil {
		return err
	}
	switch f.progress {
	case "auto", "always", "never":
		return nil
	}
	return usageErrorf("--progress must be auto, always or never, got %q", f.progress)
}

// client is a lock client that creates missing locks with --create.
func (f *acquireFlags) client(ctx context.Context, o *options, extra ...lock.Option) (*lock.Client, error) {
	if f.create {
		extra = append(extra, lock.WithAutoCreate())
	}
	return o.lockClient(ctx, extra...)
}

// acquire takes the lock with pkg/lock: TryAcquire when --wait is 0, else
// Acquire, showing the live waiting line on errOut.
func (f *acquireFlags) acquire(ctx context.Context, c *lock.Client, key string, errOut io.Writer, opts ...lock.AcquireOption) (*lock.Lock, error) {
	opts = f.options(opts...)
	if f.wait == 0 {
		l, err := c.TryAcquire(ctx, key, opts...)
		return l, notFound(err, c.Namespace(), key, true)
	}
	name, _ := lock.NameForKey(key) // checked by check
	p := newProgress(errOut, name, f.progress)
	defer p.done()
	l, err := c.Acquire(ctx, key, append(opts, lock.WithWaitTimeout(f.wait), lock.WithQueueCallback(p.update))...)
	return l, notFound(err, c.Namespace(), key, true)
}

// options are opts with --lease, --request-id and --shared.
func (f *acquireFlags) options(opts ...lock.AcquireOption) []lock.AcquireOption {
	if f.shared {
		opts = append(opts, lock.WithShared())
	}
	if f.lease > 0 {
		opts = append(opts, lock.WithLeaseDuration(f.lease))
	}
	if f.requestID != "" {
		opts = append(opts, lock.WithRequestID(f.requestID))
	}
	return opts
}

// signalContext ends on SIGINT or SIGTERM; interrupted then says which came.
func signalContext(ctx context.Context) (context.Context, func() (os.Signal, bool), context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	var mu sync.Mutex
	var got os.Signal
	go func() {
		select {
		case s := <-ch:
			mu.Lock()
			got = s
			mu.Unlock()
			cancel()
		case <-ctx.Done():
		}
	}()
	interrupted := func() (os.Signal, bool) {
		mu.Lock()
		defer mu.Unlock()
		return got, got != nil
	}
	return ctx, interrupted, func() { signal.Stop(ch); cancel() }
}

// signalExit is the shell's exit code for a process ended by s.
func signalExit(s os.Signal) error {
	n := 0
	if sig, ok := s.(syscall.Signal); ok {
		n = int(sig)
	}
	return withCode(128+n, errorf("interrupted by %s", s))
}

func newAcquireCommand(o *options) *cobra.Command {
	var f acquireFlags
	var sessionTTL time.Duration
	cmd := &cobra.Command{
		Use:   "acquire KEY...",
		Short: "Take a lock (or several, in one session) and print its lease (token, lease ID, expiry); it is not renewed",
		Long: `Take the lock for KEY and print the lease. The lease is not renewed: it ends
when it runs out, or earlier with "kubelock release KEY --lease-id ID".
Use "kubelock run" or "kubelock sidecar" to hold a lock while work runs.

With --session-ttl, take every KEY in one new LockSession, in order; if one
cannot be taken, the session is closed and the ones taken end with it. Nobody
renews the session once acquire exits: every lock in it ends when the session
lapses (SessionExpired, after its TTL) or is closed with
"kubelock force-release --session NAME" (SessionClosed).`,
		Example: `  kubelock acquire orders-db --wait 30s --lease 5m -o json
  kubelock release orders-db --lease-id 2b0c...
  kubelock acquire catalog --shared    # one of an RWMutex's readers
  kubelock acquire indexers            # a Semaphore's permit: prints its SLOT
  kubelock acquire stock-1 stock-2 stock-3 --create --session-ttl 10m`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageErrorf("expected at least one KEY")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, keys []string) error {
			for _, key := range keys {
				if err := f.check(key); err != nil {
					return err
				}
			}
			switch {
			case len(keys) > 1 && sessionTTL == 0:
				return usageErrorf("several KEYs are held in one session: add --session-ttl")
			case len(keys) > 1 && f.requestID != "":
				return usageErrorf("--request-id goes with one KEY")
			case sessionTTL != 0 && (sessionTTL < locksv1alpha1.MinSessionTTLSeconds*time.Second ||
				sessionTTL > locksv1alpha1.MaxSessionTTLSeconds*time.Second || sessionTTL%time.Second != 0):
				return usageErrorf("--session-ttl must be whole seconds within %ds..%ds, got %s",
					locksv1alpha1.MinSessionTTLSeconds, locksv1alpha1.MaxSessionTTLSeconds, sessionTTL)
			}
			if err := o.checkOutput(); err != nil {
				return err
			}
			c, err := f.client(cmd.Context(), o, lock.WithoutAutoRenew())
			if err != nil {
				return err
			}
			ctx, interrupted, stop := signalContext(cmd.Context())
			defer stop()
			views, err := f.acquireAll(ctx, c, keys, sessionTTL, o.streams.ErrOut)
			if err != nil {
				if s, ok := interrupted(); ok {
					return signalExit(s)
				}
				return err
			}
			return printLeases(o.streams.Out, o.output, views, o.now())
		},
	}
	f.add(cmd.Flags(), 0, true)
	cmd.Flags().DurationVar(&sessionTTL, "session-ttl", 0, fmt.Sprintf("take the KEYs in one new session with this TTL (%ds..%ds); it is not renewed after acquire exits",
		locksv1alpha1.MinSessionTTLSeconds, locksv1alpha1.MaxSessionTTLSeconds))
	o.addOutputFlag(cmd.Flags())
	return cmd
}

// acquireAll takes keys in order, in a new session when ttl is set; on an
// error it closes the session, which ends what it took.
func (f *acquireFlags) acquireAll(ctx context.Context, c *lock.Client, keys []string, ttl time.Duration, errOut io.Writer) ([]leaseView, error) {
	var s *lock.Session
	var opts []lock.AcquireOption
	if ttl > 0 {
		var err error
		if s, err = c.NewSession(ctx, lock.WithTTL(ttl)); err != nil {
			return nil, err
		}
		opts = append(opts, lock.WithSession(s))
	}
	var views []leaseView
	for _, key := range keys {
		l, err := f.acquire(ctx, c, key, errOut, opts...)
		if err != nil {
			if s != nil {
				_ = cleanup(s.Close) // best effort: unclosed, it lapses after its TTL
			}
			return nil, err
		}
		v := leaseView{Namespace: c.Namespace(), Name: l.Name(), Key: l.Key(), Identity: c.Identity(),
			FencingToken: l.FencingToken(), LeaseID: l.LeaseID(), RequestID: l.RequestID(), ExpiresAt: l.ExpiresAt()}
		if slot, shared := l.Slot(); shared {
			v.Slot = &slot
		}
		if s != nil {
			v.Session = s.Name()
		}
		views = append(views, v)
	}
	return views, nil
}

func newReleaseCommand(o *options) *cobra.Command {
	var leaseID string
	cmd := o.keyCommand(&cobra.Command{
		Use:   "release KEY --lease-id ID",
		Short: "Release a lease taken with acquire (only its holder may)",
		Long:  "Release the lease ID of KEY. Releasing a lease that was already released by you succeeds again; a lease that ended otherwise is reported as lost.",
	}, func() error {
		if leaseID == "" {
			return usageErrorf("--lease-id is required")
		}
		return nil
	}, func(ctx context.Context, c *lock.Client, key, name string) error {
		if err := c.ReleaseLease(ctx, key, leaseID); err != nil {
			return err
		}
		printf(o.streams.Out, "released %s/%s (lease %s)\n", c.Namespace(), name, leaseID)
		return nil
	})
	cmd.Flags().StringVar(&leaseID, "lease-id", "", "the lease to release, as printed by acquire (required)")
	return cmd
}

func newForceReleaseCommand(o *options) *cobra.Command {
	var reason, session string
	cmd := o.keyCommand(&cobra.Command{
		Use:   "force-release (KEY --reason TEXT | --session NAME)",
		Short: "Break a lock, or a session and every lock held in it, whoever holds it (needs the RBAC verb force-release)",
		Long: `End every holding of KEY (its holder, or all of its readers or permits),
recording you and the reason in the lock's recentAcquisitions and an Event.
Each holder learns at its next renewal that it lost the lock. Needs the verb force-release on distributedlocks (break-glass).

With --session NAME, delete the LockSession NAME instead: the controller ends
every holding in it at once (endReason SessionClosed) and prints which locks
were held in it. Needs the verb force-release on locksessions, unless the
session is your own.`,
		Example: `  kubelock force-release orders-db --reason "stuck job, ticket 42"
  kubelock force-release --session worker-7d9f-x2k8q`,
	}, func() error {
		if reason == "" {
			return usageErrorf("--reason is required: it is recorded with the lock")
		}
		return nil
	}, func(ctx context.Context, c *lock.Client, key, name string) error {
		ended, err := c.ForceRelease(ctx, key, reason)
		switch {
		case err != nil:
			return err
		case len(ended) == 0:
			printf(o.streams.Out, "%s/%s was not held; nothing to release\n", c.Namespace(), name)
		}
		for _, e := range ended {
			slot := ""
			if e.Slot != nil {
				slot = fmt.Sprintf("slot %d, ", *e.Slot)
			}
			printf(o.streams.Out, "force-released %s/%s: ended lease %s of %s (%stoken %d)\n",
				c.Namespace(), name, e.LeaseID, e.Identity, slot, e.FencingToken)
		}
		return nil
	})
	cmd.Flags().StringVar(&reason, "reason", "", "why, recorded in the lock's history and event (required with KEY, at most 256 characters)")
	cmd.Flags().StringVar(&session, "session", "", "end this session (a LockSession in the namespace) and every lock held in it")
	byKey := cmd.RunE
	cmd.Args = func(c *cobra.Command, args []string) error {
		if session == "" {
			return exactArgs(1, "one KEY or --session NAME")(c, args)
		}
		return exactArgs(0, "no KEY with --session")(c, args)
	}
	cmd.RunE = func(c *cobra.Command, args []string) error {
		if session == "" {
			return byKey(c, args)
		}
		if reason != "" {
			return usageErrorf("--reason goes with a KEY: deleting a session records no reason (its locks end with SessionClosed)")
		}
		if errs := validation.IsDNS1123Subdomain(session); len(errs) > 0 {
			return usageErrorf("--session %q is not a session name: %s", session, errs[0])
		}
		return o.forceReleaseSession(c.Context(), session)
	}
	return cmd
}

// keyCommand completes cmd, a command on one existing lock: it checks the KEY
// and then the flags (check, if any), builds the lock client, runs run, and restates a
// missing lock in the CLI's terms.
func (o *options) keyCommand(cmd *cobra.Command, check func() error, run func(ctx context.Context, c *lock.Client, key, name string) error) *cobra.Command {
	cmd.Args = exactArgs(1, "one KEY")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		key := args[0]
		if err := checkKey(key); err != nil {
			return err
		}
		if check != nil {
			if err := check(); err != nil {
				return err
			}
		}
		c, err := o.lockClient(cmd.Context())
		if err != nil {
			return err
		}
		name, _ := lock.NameForKey(key)
		return notFound(run(cmd.Context(), c, key, name), c.Namespace(), key, false)
	}
	return cmd
}

// progress is the live waiting line: redrawn in place every second on a
// terminal, one line per change otherwise (--progress=always).
type progress struct {
	w     io.Writer
	name  string
	tty   bool
	start time.Time
	stop  chan struct{}

	mu      sync.Mutex
	q       lock.QueueStatus
	drawn   bool
	stopped bool // done was called: draw no more
}

func newProgress(w io.Writer, name, mode string) *progress {
	p := &progress{w: w, name: name, start: time.Now(), stop: make(chan struct{})}
	if f, ok := w.(*os.File); ok {
		p.tty = term.IsTerminal(int(f.Fd()))
	}
	switch {
	case mode == "never", mode == "auto" && !p.tty:
		p.w, p.tty = nil, false
	case p.tty:
		go wait.Until(p.redraw, time.Second, p.stop)
	}
	return p
}

func (p *progress) update(q lock.QueueStatus) {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.q = q
	p.drawLocked()
}

func (p *progress) redraw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drawLocked()
}

func (p *progress) drawLocked() {
	if p.q.Position == 0 || p.stopped {
		return
	}
	holder := "free, handing over"
	switch h := p.q.Holder; {
	case h != nil:
		holder = "held by " + h.Identity
	case p.q.Holdings > 0:
		holder = fmt.Sprintf("held shared by %d", p.q.Holdings)
	}
	line := shown(fmt.Sprintf("waiting for %s: position %d of %d, %s, %s elapsed", p.name, p.q.Position, p.q.Waiters, holder,
		duration.HumanDuration(time.Since(p.start))))
	if p.tty {
		_, _ = fmt.Fprintf(p.w, "\r\x1b[K%s", line)
	} else {
		_, _ = fmt.Fprintln(p.w, line)
	}
	p.drawn = true
}

// done stops redrawing and clears the line on a terminal.
func (p *progress) done() {
	close(p.stop)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopped = true
	if p.tty && p.drawn {
		_, _ = fmt.Fprint(p.w, "\r\x1b[K")
	}
}
