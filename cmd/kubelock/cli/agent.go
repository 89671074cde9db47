package cli

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/spf13/cobra"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/cmd/kubelock/agent"
	"github.com/kubelock/kubelock/pkg/lock"
)

// agentFlags are the flags of kubelock agent.
type agentFlags struct {
	listen     string
	sessionTTL time.Duration
	lease      time.Duration
	create     bool
	stores     []string
	maxLocks   int
}

// The agent is a command of its own rather than the sidecar grown: the
// sidecar holds one lock for the pod's life and its /readyz says whether this
// pod holds it (a Service routes to the active pod by it); the agent holds
// whatever the app asks for, when it asks, and is ready once it can take
// locks. Both run as native sidecars and share the probe command.
func newAgentCommand(o *options) *cobra.Command {
	var f agentFlags
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Take locks on demand for the pod's containers: a JSON API on 127.0.0.1, and Dapr's lock API",
		Long: `Serve locks to the app beside it, in any language, over HTTP on --listen
(default ` + DefaultListen + `: the pod's containers only). Every holding lives in the
agent's one LockSession, renewed once for all of them; if the agent stops
renewing it, the controller ends them all after --session-ttl, and the session of
a pod-bound token is deleted with its pod.

  POST   /v1/locks/{key}?wait=10s&lease=30s&shared=true   acquire (no wait: try once)
  GET    /v1/locks/{key}?leaseID=ID&wait=60s               the holding; with wait, answers once it ends
  POST   /v1/locks/{key}/renew?leaseID=ID                  renew its lease
  DELETE /v1/locks/{key}?leaseID=ID                        release
  GET    /v1/locks                                         the agent's holdings

An acquire answers the holding: fencingToken, slot (shared), leaseID and
expiresAt, the safe deadline. A holding lasts its lease (default --lease) unless
renewed; the agent releases it then. Errors are JSON {"error", "reason"}: 409
locked or timeout, 404 not held (or why it ended: released, expired, lost), 400
bad request, 403 denied, 503 unavailable.

Dapr's distributed lock API is served too: POST /v1.0-alpha1/lock/{store}
and /v1.0-alpha1/unlock/{store} (store: --dapr-store), with /v1.0/healthz,
/v1.0/healthz/outbound and /v1.0/metadata, so a Dapr SDK that speaks HTTP (the
JavaScript SDK) works with DAPR_HTTP_PORT set to the agent's port. The lock
answer adds fencingToken. docs/agent.md has the details.

/healthz answers 200 while the process runs, /readyz while the agent has a
session ("kubelock probe readyz" is its exec probe). On SIGTERM or SIGINT it
releases every holding, closes its session and exits 0. It exits on bad flags
and on refusals of its session by RBAC or a missing LockSession kind.`,
		Example: `  kubelock agent --listen 127.0.0.1:8477
  curl -X POST 'http://127.0.0.1:8477/v1/locks/orders%2F42?wait=10s'`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.check(); err != nil {
				return err
			}
			return o.agent(cmd.Context(), &f)
		},
	}
	flags := cmd.Flags()
	flags.StringVar(&f.listen, "listen", DefaultListen, "loopback address to serve on (port 0 picks a free one)")
	flags.DurationVar(&f.sessionTTL, "session-ttl", lock.DefaultSessionTTL, "TTL of the agent's LockSession: how long its locks outlive the agent's last renewal (whole seconds, 5s..1h)")
	flags.DurationVar(&f.lease, "lease", agent.DefaultLease, "lease of a holding whose acquire names none: the agent releases a holding the app did not renew for that long")
	flags.BoolVar(&f.create, "create", true, "create a lock on first use (labelled auto-created; the controller deletes it once idle); false takes only locks that exist")
	flags.StringSliceVar(&f.stores, "dapr-store", []string{agent.DefaultDaprStore}, "lock store names Dapr's API answers to")
	flags.IntVar(&f.maxLocks, "max-locks", agent.DefaultMaxLocks, "most locks held and awaited at once")
	return cmd
}

func (f *agentFlags) check() error {
	if err := checkLoopback(f.listen); err != nil {
		return err
	}
	ttl := f.sessionTTL
	if ttl < locksv1alpha1.MinSessionTTLSeconds*time.Second || ttl > locksv1alpha1.MaxSessionTTLSeconds*time.Second || ttl%time.Second != 0 {
		return usageErrorf("--session-ttl must be whole seconds within %ds..%ds, got %s", locksv1alpha1.MinSessionTTLSeconds, locksv1alpha1.MaxSessionTTLSeconds, ttl)
	}
	if err := checkLease(f.lease); err != nil || f.lease == 0 {
		return usageErrorf("--lease must be whole seconds within 1s..%ds, got %s", locksv1alpha1.MaxLeaseDurationSeconds, f.lease)
	}
	for _, s := range f.stores {
		if s == "" || strings.ContainsAny(s, "/?#%") {
			return usageErrorf("--dapr-store %q: a store name is one path segment", s)
		}
	}
	if f.maxLocks < 1 {
		return usageErrorf("--max-locks must be at least 1, got %d", f.maxLocks)
	}
	return nil
}

func (o *options) agent(ctx context.Context, f *agentFlags) error {
	var extra []lock.Option
	if f.create {
		extra = append(extra, lock.WithAutoCreate())
	}
	c, err := o.lockClient(ctx, extra...)
	if err != nil {
		return err
	}
	logf := func(format string, args ...any) {
		_, _ = fmt.Fprintf(o.streams.ErrOut, "%s kubelock agent: %s\n", time.Now().UTC().Format(time.RFC3339), shown(fmt.Sprintf(format, args...)))
	}
	a := agent.New(c, agent.Options{
		SessionTTL: f.sessionTTL, Lease: f.lease, DaprStores: f.stores, MaxLocks: f.maxLocks,
		Fatal: permanent, Logf: logf, Version: Version,
	})
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return usageErrorf("--listen %s: %w", f.listen, err)
	}
	srv := a.Server()
	go func() { _ = srv.Serve(ln) }()
	defer func() { _ = srv.Close() }()
	logf("serving on http://%s (locks in namespace %s as %s; Dapr lock stores %s)", ln.Addr(), c.Namespace(), c.Identity(), strings.Join(f.stores, ", "))
	if o.lockServerFound != "" {
		logf("lock requests go straight to the lock server at %s", o.lockServerFound)
	}

	ctx, interrupted, stop := signalContext(ctx)
	defer stop()
	runErr := a.Run(ctx)
	a.Close()
	if runErr != nil {
		return runErr
	}
	s, _ := interrupted()
	logf("stopping on %v: released every lock, closed the session", s)
	return nil
}

// checkLoopback refuses a --listen address off the loopback interface: the
// agent checks no credentials, so whoever reaches it takes and releases
// locks as the pod's identity. Only an IP literal is taken: a name could
// resolve anywhere.
func checkLoopback(listen string) error {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return usageErrorf("--listen %q: %v", listen, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return usageErrorf("--listen %s: the agent serves the pod's own containers and checks no credentials, so it listens on a loopback address only (127.0.0.1:PORT or [::1]:PORT)", listen)
	}
	return nil
}
