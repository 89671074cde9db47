package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/renameio/v2"
	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubelock/kubelock/pkg/lock"
)

// DefaultListen is where the sidecar and the agent serve; localhost only:
// they serve the pod's own containers and its exec probes.
const DefaultListen = "127.0.0.1:8477"

func newSidecarCommand(o *options) *cobra.Command {
	var (
		f         acquireFlags
		tokenFile string
		listen    string
		session   bool
	)
	cmd := &cobra.Command{
		Use:   "sidecar KEY",
		Short: "Hold a lock for the pod's life: token file, /v1/lock, /healthz, /readyz",
		Long: `Take the lock for KEY and keep it for as long as this process runs, taking
it again whenever it is lost. While held, the fencing token is in --token-file
(decimal and a newline, replaced atomically; removed while not held), and

  GET /v1/lock   JSON: held, namespace, name, key, identity, token, slot (of a
                 shared holding), leaseID, expiresAt, queue
  GET /healthz   200 while the process runs
  GET /readyz    200 only while the lock is held, else 503 (active/passive pods)

are served on --listen (default ` + DefaultListen + `: the pod's containers only).
With --shared it holds an RWMutex as a reader; a Semaphore's permit is always
shared (the token file then holds that permit's token, /v1/lock its slot). On
SIGTERM or SIGINT it stops being ready, releases the lock, closes its session
and exits 0. The lock is held in a LockSession (TTL = the lease; a new one
when a session ends); --session=false renews the lock itself, for clusters
without the LockSession kind or RBAC for it. Run it
as a Kubernetes native sidecar (an initContainer with restartPolicy: Always)
with exec probes, "kubelock probe readyz" as the readinessProbe and "kubelock
probe healthz" as the livenessProbe. The token file's default is
/run/kubelock/<name>/token.

It exits on bad flags, a missing lock (without --create) and refusals by RBAC.
Denials that depend on the lock's state — a kubelock admission rule or the
lock's validation (exit code 77 elsewhere) — are logged and retried with
back-off, as are unreachable apiservers: they change when the lock does.`,
		Args: exactArgs(1, "one KEY"),
		RunE: func(cmd *cobra.Command, args []string) error {
			key := args[0]
			if err := f.check(key); err != nil {
				return err
			}
			if tokenFile == "" {
				name, _ := lock.NameForKey(key)
				tokenFile = filepath.Join("/run/kubelock", name, "token")
			}
			return o.sidecar(cmd.Context(), key, &f, tokenFile, listen, session)
		},
	}
	f.add(cmd.Flags(), lock.DefaultWaitTimeout, false)
	_ = cmd.Flags().MarkHidden("wait") // the sidecar waits for as long as it runs
	cmd.Flags().StringVar(&tokenFile, "token-file", "", "where to write the fencing token (default /run/kubelock/<name>/token)")
	cmd.Flags().StringVar(&listen, "listen", DefaultListen, "address for /v1/lock, /healthz and /readyz (port 0 picks a free one)")
	addSessionFlag(cmd, &session)
	return cmd
}

// lockState is the sidecar's answer on /v1/lock.
type lockState struct {
	Held         bool   `json:"held"`
	Namespace    string `json:"namespace"`
	Name         string `json:"name"`
	Key          string `json:"key"`
	Identity     string `json:"identity"`
	FencingToken int64  `json:"token,omitempty"`
	// Slot is the permit of a shared holding (--shared, or a Semaphore).
	Slot      *int32     `json:"slot,omitempty"`
	LeaseID   string     `json:"leaseID,omitempty"`
	ExpiresAt *time.Time `json:"expiresAt,omitempty"`
	// Queue is the sidecar's place in the lock's queue while it waits.
	Queue *queueState `json:"queue,omitempty"`
}

type queueState struct {
	Position int    `json:"position"`
	Waiters  int    `json:"waiters"`
	Holder   string `json:"holder,omitempty"`
}

// sidecarState is the current holding, shared with the HTTP handlers.
type sidecarState struct {
	mu    sync.Mutex
	base  lockState
	held  *lock.Lock
	queue *queueState
}

func (s *sidecarState) snapshot() lockState {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.base
	if l := s.held; l != nil && l.Err() == nil {
		exp := l.ExpiresAt()
		st.Held, st.FencingToken, st.LeaseID, st.ExpiresAt = true, l.FencingToken(), l.LeaseID(), &exp
		if slot, shared := l.Slot(); shared {
			st.Slot = &slot
		}
	} else {
		st.Queue = s.queue
	}
	return st
}

func (s *sidecarState) set(l *lock.Lock) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held, s.queue = l, nil
}

func (s *sidecarState) queued(q lock.QueueStatus) {
	qs := &queueState{Position: q.Position, Waiters: q.Waiters}
	if q.Holder != nil {
		qs.Holder = q.Holder.Identity
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queue = qs
}

func (s *sidecarState) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/lock", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(s.snapshot())
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !s.snapshot().Held {
			http.Error(w, "lock not held", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok: lock held\n")
	})
	return mux
}

func (o *options) sidecar(ctx context.Context, key string, f *acquireFlags, tokenFile, listen string, session bool) error {
	c, err := f.client(ctx, o)
	if err != nil {
		return err
	}
	name, _ := lock.NameForKey(key)
	state := &sidecarState{base: lockState{Namespace: c.Namespace(), Name: name, Key: key, Identity: c.Identity()}}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return usageErrorf("--listen %s: %w", listen, err)
	}
	srv := &http.Server{Handler: state.handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer func() { _ = srv.Close() }()
	logf := func(format string, args ...any) {
		_, _ = fmt.Fprintf(o.streams.ErrOut, "%s kubelock sidecar: %s\n", time.Now().UTC().Format(time.RFC3339), shown(fmt.Sprintf(format, args...)))
	}
	logf("serving on http://%s (lock %s/%s, token file %s)", ln.Addr(), c.Namespace(), name, tokenFile)
	if o.lockServerFound != "" {
		logf("lock requests go straight to the lock server at %s", o.lockServerFound)
	}

	ctx, interrupted, stop := signalContext(ctx)
	defer stop()
	back := sidecarBackoff()
	var sess *lock.Session
	defer func() { // after the release below
		if sess != nil {
			o.closeSession(sess)
		}
	}()
	for {
		var (
			l   *lock.Lock
			err error
		)
		if session && (sess == nil || sess.Err() != nil) {
			if sess != nil {
				o.closeSession(sess) // it ended: make sure nothing waits for it to lapse
			}
			sess, err = o.openSession(ctx, c, []string{key}, f.lease)
		}
		if err == nil {
			// Wait the longest pkg/lock allows, then queue up again.
			l, err = c.Acquire(ctx, key, f.options(lock.WithWaitTimeout(lock.DefaultWaitTimeout), lock.WithQueueCallback(state.queued), lock.WithSession(sess))...)
		}
		err = notFound(err, c.Namespace(), key, true)
		switch {
		case ctx.Err() != nil:
			if l != nil {
				o.releaseOrWarn(l)
			}
			s, _ := interrupted()
			logf("stopping on %v", s)
			return nil
		case errors.Is(err, lock.ErrTimeout):
			continue // waited the longest pkg/lock allows; queue up again
		case err != nil && permanent(err):
			return err
		case err != nil:
			d := back.Step()
			logf("acquire failed, retrying in %s: %s", d, oneLine(err))
			select { // a cancelled ctx ends the loop above
			case <-ctx.Done():
			case <-time.After(d):
			}
			continue
		}
		back = sidecarBackoff()
		if err := writeTokenFile(tokenFile, l.FencingToken()); err != nil {
			o.releaseOrWarn(l)
			return errorf("writing the token file: %w", err)
		}
		state.set(l)
		if slot, shared := l.Slot(); shared {
			logf("holding %s/%s shared on slot %d with token %d (lease %s)", c.Namespace(), name, slot, l.FencingToken(), l.LeaseID())
		} else {
			logf("holding %s/%s with token %d (lease %s)", c.Namespace(), name, l.FencingToken(), l.LeaseID())
		}
		select {
		case <-l.Done():
		case <-ctx.Done():
		}
		// Not ready first, so traffic stops before anyone else can hold the lock.
		state.set(nil)
		_ = os.Remove(tokenFile)
		if ctx.Err() == nil {
			logf("%s; waiting to take it again", oneLine(context.Cause(l.Context())))
			continue
		}
		s, _ := interrupted()
		if err := cleanup(l.Release); err != nil {
			logf("stopping on %v; release failed, the lease will expire: %s", s, oneLine(err))
		} else {
			logf("stopping on %v; released %s/%s", s, c.Namespace(), name)
		}
		return nil
	}
}

// permanent errors make the sidecar exit (in a pod, the kubelet restarts it
// with its back-off, visibly): bad flags, and a missing lock or credentials
// and RBAC that someone must fix for this pod. A denial that depends on the
// lock's state is not permanent: admission ("[kubelock:<rule>]", e.g. a full
// per-user queue, a lock being deleted) and the CRD's validation (422, e.g. a
// lock left unwritable by someone else's entries until the controller or an
// administrator repairs it) change when the lock does, so the sidecar keeps
// retrying with back-off and logs each denial.
func permanent(err error) bool {
	if lockStateDenial(err) {
		return false
	}
	switch exitCode(err) {
	case ExitNotFound, ExitDenied, ExitUsage:
		return true
	}
	return false
}

// lockStateDenial reports a refusal that depends on the lock's state rather
// than on who asks: a kubelock admission rule, or the CRD's validation.
func lockStateDenial(err error) bool {
	return apierrors.IsInvalid(err) || (apierrors.IsForbidden(err) && strings.Contains(err.Error(), "[kubelock:"))
}

// sidecarBackoff is the pause between failed acquires: 1s, doubling to 30s.
func sidecarBackoff() wait.Backoff {
	return wait.Backoff{Duration: time.Second, Factor: 2, Steps: math.MaxInt32, Cap: 30 * time.Second}
}

// writeTokenFile replaces path atomically and durably (fsync): readers see the
// old token or the new one, never a partial write.
func writeTokenFile(path string, token int64) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return renameio.WriteFile(path, []byte(strconv.FormatInt(token, 10)+"\n"), 0o644,
		renameio.WithTempDir(dir), renameio.WithStaticPermissions(0o644))
}
