package leaderelection

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/kubelock/kubelock/pkg/lock"
	kle "github.com/kubelock/kubelock/pkg/lock/leaderelection"
)

// A candidate is this test binary run again as a child process (see
// TestMain): a controller-runtime manager electing on the lock the
// environment names, with one runnable that needs leadership. It reports on
// stdout, one line each, with the wall-clock time in Unix nanoseconds:
//
//	ASKING <ns>             the elector calls Get (a kubelock candidate then
//	                        blocks until its turn)
//	OBSERVED <ns>           the elector's first answer from the lock
//	LEADING <ns> <token>    the leader-only runnable started (token 0 for a Lease)
//	STOPPED <ns>            the leader-only runnable's context ended
//	RELEASING <ns>          the elector asks to release (ReleaseOnCancel)
//	EXIT <ns> <error>       the manager returned
const (
	envRole       = "LE_TEST_ROLE" // "candidate"
	envKubeconfig = "LE_TEST_KUBECONFIG"
	envKind       = "LE_TEST_KIND" // kindKubelock or kindLease
	envNamespace  = "LE_TEST_NAMESPACE"
	envName       = "LE_TEST_NAME"
	envIdentity   = "LE_TEST_IDENTITY"
	envTimings    = "LE_TEST_TIMINGS" // lease,renew,retry as Go durations
)

const (
	kindKubelock = "kubelock"
	kindLease    = "lease"
)

// runCandidate is the child's main; its exit code is the process's.
func runCandidate() int {
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.UseDevMode(true)))
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv(envKubeconfig))
	if err != nil {
		report("EXIT", err.Error())
		return 1
	}
	t, err := parseTimings(os.Getenv(envTimings))
	if err != nil {
		report("EXIT", err.Error())
		return 1
	}
	ns, name, id := os.Getenv(envNamespace), os.Getenv(envName), os.Getenv(envIdentity)

	var rl resourcelock.Interface
	var token func() int64
	switch os.Getenv(envKind) {
	case kindKubelock:
		k, err := kle.New(cfg, name, kle.Options{LeaseDuration: t[0], RenewDeadline: t[1], RetryPeriod: t[2]},
			lock.WithNamespace(ns), lock.WithIdentity(id))
		if err != nil {
			report("EXIT", err.Error())
			return 1
		}
		rl, token = k, k.FencingToken
	case kindLease:
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			report("EXIT", err.Error())
			return 1
		}
		if rl, err = resourcelock.New(resourcelock.LeasesResourceLock, ns, name, cs.CoreV1(), cs.CoordinationV1(),
			resourcelock.ResourceLockConfig{Identity: id}); err != nil {
			report("EXIT", err.Error())
			return 1
		}
		token = func() int64 { return 0 }
	default:
		report("EXIT", "unknown "+envKind)
		return 1
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Metrics:                             metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:              "0",
		LeaderElection:                      true,
		LeaderElectionResourceLockInterface: &traced{Interface: rl},
		LeaseDuration:                       &t[0],
		RenewDeadline:                       &t[1],
		RetryPeriod:                         &t[2],
		LeaderElectionReleaseOnCancel:       true,
	})
	if err != nil {
		report("EXIT", err.Error())
		return 1
	}
	stopped := make(chan struct{})
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		report("LEADING", strconv.FormatInt(token(), 10))
		<-ctx.Done()
		report("STOPPED")
		close(stopped)
		return nil
	})); err != nil {
		report("EXIT", err.Error())
		return 1
	}
	err = mgr.Start(ctrl.SetupSignalHandler())
	// A manager that lost leadership returns without waiting for its
	// runnables; their contexts are cancelled already, so this is quick.
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
	}
	report("EXIT", fmt.Sprint(err))
	if err != nil {
		return 1
	}
	return 0
}

func parseTimings(s string) ([3]time.Duration, error) {
	var t [3]time.Duration
	var a, b, c string
	if _, err := fmt.Sscanf(s, "%s %s %s", &a, &b, &c); err != nil {
		return t, fmt.Errorf("%s %q: %w", envTimings, s, err)
	}
	for i, v := range []string{a, b, c} {
		d, err := time.ParseDuration(v)
		if err != nil {
			return t, err
		}
		t[i] = d
	}
	return t, nil
}

var reportMu sync.Mutex

// report writes one line: what, the time, and the arguments.
func report(what string, args ...string) {
	reportMu.Lock()
	defer reportMu.Unlock()
	line := what + " " + strconv.FormatInt(time.Now().UnixNano(), 10)
	for _, a := range args {
		line += " " + strconv.Quote(a)
	}
	_, _ = fmt.Fprintln(os.Stdout, line)
}

// traced reports the elector's first answer and its release request, the
// moments the parent measures from.
type traced struct {
	resourcelock.Interface
	observed sync.Once
}

func (t *traced) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	report("ASKING")
	rec, raw, err := t.Interface.Get(ctx)
	if err == nil {
		t.observed.Do(func() { report("OBSERVED") })
	}
	return rec, raw, err
}

func (t *traced) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	if ler.HolderIdentity == "" {
		report("RELEASING")
	}
	return t.Interface.Update(ctx, ler)
}
