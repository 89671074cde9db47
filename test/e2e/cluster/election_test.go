//go:build cluster

package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/cmd/kubelock-dev/devenv"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/testenv"
)

// The chart's release and the users the election runs as.
const (
	release          = "kubelock"
	electionLock     = "kubelock-manager.locks.kubelock.io"
	electionUser     = "system:serviceaccount:" + devenv.OperatorNamespace + ":kubelock-leader-election"
	controllerSAUser = "system:serviceaccount:" + devenv.OperatorNamespace + ":kubelock-controller-manager"
)

// TestChartElectsOnKubelock upgrades the operator kubelock-dev deployed to the
// chart with manager.leaderElection.lock=kubelock, as a user switching the
// lock would, and follows the election on the real node: a replica leads,
// deleting its pod hands the lock to the standby waiting in the queue, and
// the new leader expires a lapsed lease. The chart's replicas run as
// kubelock-controller-manager and campaign as kubelock-leader-election, which
// is what the apiserver's TokenRequest once refused to bind to their pods. At
// the end the chart goes back to the Lease election the other tests expect.
func TestChartElectsOnKubelock(t *testing.T) {
	ctx := requireCluster(t)
	upgrade := chartUpgrader(t)
	upgrade(ctx, "kubelock")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		upgrade(ctx, "lease")
		rolledOut(ctx, t, "--leader-election-lock=lease")
	})

	// The rollout: both replicas are the chart's, electing on the lock.
	pods := rolledOut(ctx, t, "--leader-election-lock=kubelock")

	// One replica leads, the other waits in the queue: both campaign.
	l := &locksv1alpha1.DistributedLock{}
	eventually(ctx, t, 100*time.Millisecond, 2*time.Minute, func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKey{Namespace: devenv.OperatorNamespace, Name: electionLock}, l); err != nil {
			return false, err
		}
		h, w := l.Status.Holder, l.Status.Waiters
		return h != nil && slices.Contains(pods, h.Identity) && len(w) == 1 && slices.Contains(pods, w[0].Identity),
			fmt.Errorf("holder %+v, waiters %+v; pods %v", h, w, pods)
	})
	leader, standby, first := l.Status.Holder.Identity, l.Status.Waiters[0].Identity, *l.Status.Holder
	t.Logf("%s leads with token %d; %s waits in the queue", leader, l.Status.FencingToken, standby)
	if first.User != electionUser || first.PodName != "" || first.PodUID != "" {
		t.Errorf("the leader holds as user %q with pod %q (%q); want %q and no pod (its token is bound to none)", first.User, first.PodName, first.PodUID, electionUser)
	}

	// Deleting the leader's pod: it releases on SIGTERM and the standby,
	// at the head of the queue, takes the lock.
	deleted := time.Now()
	if err := c.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: devenv.OperatorNamespace, Name: leader}}); err != nil {
		t.Fatal(err)
	}
	eventually(ctx, t, 20*time.Millisecond, time.Minute, func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(l), l); err != nil {
			return false, err
		}
		h := l.Status.Holder
		return h != nil && h.Identity == standby, fmt.Errorf("holder %+v", h)
	})
	t.Logf("leader pod %s deleted; %s leads %s later with token %d", leader, standby, time.Since(deleted).Round(time.Millisecond), l.Status.FencingToken)
	ended := l.Status.FindFinished(first.RequestID)
	if ended == nil || ended.LeaseID != first.LeaseID || ended.EndReason != locksv1alpha1.EndReasonReleased || ended.EndedBy != electionUser {
		t.Errorf("the deleted leader's holding ended as %+v, want Released by %s", ended, electionUser)
	}
	eventually(ctx, t, 200*time.Millisecond, 2*time.Minute, deploymentAvailable(devenv.OperatorNamespace, devenv.OperatorDeployment))

	// The new leader runs the controller: it expires a lease nobody renews.
	leaseID := lapse(ctx, t)
	logs := podLog(ctx, t, standby)
	if !strings.Contains(logs, leaseID) || !strings.Contains(logs, "holding ended") {
		t.Errorf("the new leader %s did not log the expiry of lease %s:\n%s", standby, leaseID, lastLines(logs, 20))
	}
}

// chartUpgrader returns a function that upgrades (or installs) the chart over
// what kubelock-dev deployed, with the images it imported, the fenced-objects
// webhook it registered, and lock as the election's lock; it waits for
// nothing.
func chartUpgrader(t *testing.T) func(ctx context.Context, lock string) {
	t.Helper()
	helm := os.Getenv("HELM")
	if helm == "" {
		found, _ := filepath.Glob(filepath.Join(testenv.RepoRoot(), "bin", "helm-v*"))
		if len(found) == 0 {
			t.Fatal("no helm binary: build it with `make helm` (make test-cluster does)")
		}
		helm = found[len(found)-1]
	}
	home := t.TempDir()
	return func(ctx context.Context, lock string) {
		t.Helper()
		cmd := exec.CommandContext(ctx, helm, "upgrade", "--install", release, filepath.Join(testenv.RepoRoot(), "dist", "chart"),
			"--kubeconfig", filepath.Join(dataDir, "kubeconfig"), "--namespace", devenv.OperatorNamespace,
			// kubelock-dev applied config/default: Helm adopts those objects.
			"--take-ownership", "--server-side=true", "--force-conflicts",
			"--set", "manager.image.pullPolicy="+string(corev1.PullNever), "--set", "fencedObjects.enable=true",
			"--set", "manager.leaderElection.lock="+lock)
		cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home, "HELM_CONFIG_HOME="+home, "HELM_DATA_HOME="+home)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("helm upgrade with manager.leaderElection.lock=%s: %v\n%s", lock, err, out)
		}
	}
}

// rolledOut waits until the operator's Deployment is available with two
// running pods whose manager has arg, and returns their names.
func rolledOut(ctx context.Context, t *testing.T, arg string) []string {
	t.Helper()
	var pods []string
	eventually(ctx, t, 200*time.Millisecond, 3*time.Minute, func(ctx context.Context) (bool, error) {
		var err error
		if pods, err = operatorPods(ctx, arg); err != nil {
			return false, err
		}
		ok, err := deploymentAvailable(devenv.OperatorNamespace, devenv.OperatorDeployment)(ctx)
		return ok && len(pods) == 2, errors.Join(err, fmt.Errorf("pods with %s: %v", arg, pods))
	})
	return pods
}

// operatorPods are the operator's running pods whose manager has arg and no
// deletion timestamp.
func operatorPods(ctx context.Context, arg string) ([]string, error) {
	list := &corev1.PodList{}
	if err := c.List(ctx, list, client.InNamespace(devenv.OperatorNamespace), client.MatchingLabels{"app.kubernetes.io/component": "controller-manager"}); err != nil {
		return nil, err
	}
	var out []string
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && slices.Contains(p.Spec.Containers[0].Args, arg) {
			out = append(out, p.Name)
		}
	}
	return out, nil
}

// lapse takes a lock as alice with a one-second lease and no renewal, waits
// until the controller expired it, and returns its leaseID.
func lapse(ctx context.Context, t *testing.T) string {
	t.Helper()
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: filepath.Join(dataDir, "kubeconfig")},
		&clientcmd.ConfigOverrides{CurrentContext: devenv.LockUsers[0]}).ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	alice, err := lock.New(cfg, lock.WithNamespace("default"), lock.WithoutAutoRenew(), lock.WithAutoCreate())
	if err != nil {
		t.Fatal(err)
	}
	held, err := alice.TryAcquire(ctx, "lapses-under-the-new-leader", lock.WithLeaseDuration(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	eventually(ctx, t, 100*time.Millisecond, time.Minute, func(ctx context.Context) (bool, error) {
		l, err := alice.Get(ctx, "lapses-under-the-new-leader")
		if err != nil {
			return false, err
		}
		f := l.Status.FindFinished(held.RequestID())
		return f != nil && f.EndReason == locksv1alpha1.EndReasonExpired && f.EndedBy == controllerSAUser,
			fmt.Errorf("holder %+v, ended %+v", l.Status.Holder, f)
	})
	return held.LeaseID()
}

// podLog is the log of the pod's manager container, through the kubelet.
func podLog(ctx context.Context, t *testing.T, pod string) string {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dataDir, "kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	out, err := cs.CoreV1().Pods(devenv.OperatorNamespace).GetLogs(pod, &corev1.PodLogOptions{Container: "manager"}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("logs of %s: %v", pod, err)
	}
	return string(out)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
