package leaderelection_test

import (
	"context"
	"log"
	"os"
	"time"

	clientle "k8s.io/client-go/tools/leaderelection"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/pkg/lock/leaderelection"
)

// A controller-runtime manager electing its leader on a kubelock
// DistributedLock instead of a Lease. The lock "my-operator-leader" in
// namespace my-system is created on first use (or by an administrator); the
// manager's timings must be the ResourceLock's.
func Example_controllerRuntime() {
	cfg := ctrl.GetConfigOrDie()
	o := leaderelection.Options{LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second}
	rl, err := leaderelection.New(cfg, "my-operator-leader", o,
		lock.WithNamespace("my-system"), lock.WithIdentity(os.Getenv("POD_NAME")), lock.WithAutoCreate())
	if err != nil {
		log.Fatal(err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		LeaderElection:                      true,
		LeaderElectionResourceLockInterface: rl,
		LeaseDuration:                       &o.LeaseDuration,
		RenewDeadline:                       &o.RenewDeadline,
		RetryPeriod:                         &o.RetryPeriod,
		// The process exits when the manager stops, so releasing is safe, and
		// the next candidate in the lock's queue leads within milliseconds.
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		log.Fatal(err)
	}
	// ... register controllers; once elected, they write with rl.FencingToken()
	// and the protected resource refuses a deposed leader's lower token.
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		log.Fatal(err) // includes "leader election lost": exit at once
	}
}

// client-go's elector on a DistributedLock: ElectionConfig fills in the
// lock's timings and ReleaseOnCancel.
func ExampleResourceLock_ElectionConfig() {
	rl, err := leaderelection.New(ctrl.GetConfigOrDie(), "nightly-job-leader", leaderelection.Options{},
		lock.WithNamespace("jobs"), lock.WithIdentity(os.Getenv("POD_NAME")))
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	clientle.RunOrDie(ctx, rl.ElectionConfig(clientle.LeaderCallbacks{
		OnStartedLeading: func(ctx context.Context) {
			runJobs(ctx, rl.FencingToken()) // stop when ctx ends
		},
		OnStoppedLeading: func() { os.Exit(0) },
	}))
}

func runJobs(context.Context, int64) {}
