//go:build cluster

package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
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
		// Back to the election kubelock-dev deployed, which the other tests
		// read: config/default's Lease, or the chart's lock on the apiserver
		// backend.
		lock := "lease"
		if apiserverBackend() {
			lock = "kubelock"
		}
		upgrade(ctx, lock)
		rolledOut(ctx, t, "--leader-election-lock="+lock)
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
	leaderLog := followLog(ctx, t, leader)
	unreached := webhookCallErrors(ctx, t)
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
	t.Logf("leader pod %s deleted; %s leads %s later with token %d; %d admission requests failed to reach a webhook meanwhile",
		leader, standby, time.Since(deleted).Round(time.Millisecond), l.Status.FencingToken, webhookCallErrors(ctx, t)-unreached)
	ended := l.Status.FindFinished(first.RequestID)
	if ended == nil || ended.LeaseID != first.LeaseID || ended.EndReason != locksv1alpha1.EndReasonReleased || ended.EndedBy != electionUser {
		t.Errorf("the deleted leader's holding ended as %+v, want Released by %s; the deleted leader's last log lines:\n%s",
			ended, electionUser, lastLines(leaderLog(), 40))
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
	helm, err := testenv.Helm()
	if err != nil {
		t.Fatal(err)
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
		if apiserverBackend() {
			// The values kubelock-dev installed the chart with: an upgrade
			// without backend=apiserver would be refused (the crd backend
			// while the APIService serves the lock API).
			for _, v := range devenv.ChartValues {
				cmd.Args = append(cmd.Args, "--set", v)
			}
		}
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
	out, err := clientset(t).CoreV1().Pods(devenv.OperatorNamespace).GetLogs(pod, &corev1.PodLogOptions{Container: "manager"}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("logs of %s: %v", pod, err)
	}
	return string(out)
}

// followLog streams the manager's log of an operator pod from now on, so that
// what a pod logs while it stops is kept after the pod is gone; the returned
// function gives what arrived so far.
func followLog(ctx context.Context, t *testing.T, pod string) func() string {
	t.Helper()
	var (
		mu  sync.Mutex
		buf strings.Builder
	)
	stream, err := clientset(t).CoreV1().Pods(devenv.OperatorNamespace).GetLogs(pod, &corev1.PodLogOptions{Container: "manager", Follow: true, TailLines: ptr.To[int64](0)}).Stream(ctx)
	if err != nil {
		t.Fatalf("following the logs of %s: %v", pod, err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer stream.Close()
		b := make([]byte, 32<<10)
		for {
			n, err := stream.Read(b)
			mu.Lock()
			buf.Write(b[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { stream.Close(); <-done })
	return func() string {
		mu.Lock()
		defer mu.Unlock()
		return buf.String()
	}
}

func clientset(t *testing.T) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dataDir, "kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// webhookCallErrors is the number of admission requests for which
// kube-apiserver could not call a webhook so far (its
// apiserver_admission_webhook_rejection_count with error_type
// calling_webhook_error, summed).
func webhookCallErrors(ctx context.Context, t *testing.T) int {
	t.Helper()
	raw, err := clientset(t).CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		t.Fatalf("kube-apiserver's metrics: %v", err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("kube-apiserver's metrics: %v", err)
	}
	n := 0
	for _, m := range families["apiserver_admission_webhook_rejection_count"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "error_type" && l.GetValue() == "calling_webhook_error" {
				n += int(m.GetCounter().GetValue())
			}
		}
	}
	return n
}
