//go:build cluster

// Package cluster runs kubelock on a real single-node cluster: kubelock-dev
// --node (kubelet, containerd, kube-proxy; the operator deployed from
// config/default) and the samples as pods. It needs root and the node's
// binaries (make node); `make test-cluster` runs it (build tag cluster), so
// `go test ./...` never counts it as passed when it could not run.
package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/yaml"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/cmd/kubelock-dev/devenv"
	"github.com/kubelock/kubelock/cmd/manager/operator"
	"github.com/kubelock/kubelock/internal/proc"
	"github.com/kubelock/kubelock/pkg/fencing/postgres"
	"github.com/kubelock/kubelock/test/pgtest"
	"github.com/kubelock/kubelock/test/testenv"
)

var (
	skipReason string        // why the suite cannot run here; empty when it runs
	c          client.Client // the dev cluster's admin
	devCmd     *exec.Cmd     // kubelock-dev --node
	dataDir    string
	nodeDir    string
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	log.SetLogger(zap.New(zap.WriteTo(io.Discard)))
	if os.Geteuid() != 0 {
		skipReason = "the cluster suite runs kubelet, containerd and kube-proxy: it needs root (make test-cluster as root)"
		return m.Run()
	}
	nodeDir = filepath.Join(testenv.RepoRoot(), "bin", "node")
	if _, err := os.Stat(filepath.Join(nodeDir, "containerd")); err != nil {
		skipReason = "no node binaries (make node): " + err.Error()
		return m.Run()
	}
	tmp, err := os.MkdirTemp("", "kubelock-cluster-")
	if err != nil {
		return fail(err)
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	devCmd, err = startCluster(tmp)
	if err != nil {
		return fail(err)
	}
	code := m.Run()
	if err := stopCluster(devCmd); err != nil {
		return fail(err)
	}
	return code
}

func fail(err error) int {
	fmt.Fprintln(os.Stderr, "cluster suite:", err)
	return 1
}

// startCluster builds kubelock-dev and kubelock and starts kubelock-dev --node (which builds and
// imports the operator's and the samples' images) and returns once it printed
// the ready line.
func startCluster(tmp string) (*exec.Cmd, error) {
	bin := filepath.Join(tmp, "bin")
	// kubelock-dev links the kubelock next to it as the next steps' kubectl-lock.
	build := exec.Command("go", "build", "-o", bin+"/", "./cmd/kubelock-dev", "./cmd/kubelock")
	build.Dir = testenv.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build: %w: %s", err, out)
	}
	ports, err := proc.FreePorts(4)
	if err != nil {
		return nil, err
	}
	dataDir = filepath.Join(tmp, "dev")
	dev := exec.Command(filepath.Join(bin, "kubelock-dev"), "--node", "--node-dir", nodeDir,
		"--data-dir", dataDir, "--assets-dir", testenv.AssetsDir(),
		"--apiserver-port", strconv.Itoa(ports[0]), "--etcd-port", strconv.Itoa(ports[1]),
		"--etcd-peer-port", strconv.Itoa(ports[2]), "--webhook-port", strconv.Itoa(ports[3]))
	if b := os.Getenv(backendEnv); b != "" {
		dev.Args = append(dev.Args, "--backend", b)
	}
	dev.Dir = testenv.RepoRoot() // it builds its images from the checkout
	dev.Stderr = os.Stderr
	out, err := dev.StdoutPipe()
	if err != nil {
		return nil, err
	}
	started := time.Now()
	if err := dev.Start(); err != nil {
		return nil, err
	}
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		found := false
		for sc.Scan() {
			if sc.Text() == devenv.ReadyLine && !found {
				found = true
				ready <- true
			}
		}
		if !found {
			ready <- false
		}
	}()
	select {
	case ok := <-ready:
		if !ok {
			_ = dev.Wait()
			return nil, errors.New("kubelock-dev --node exited before it was ready")
		}
	case <-time.After(10 * time.Minute):
		_ = dev.Process.Kill()
		return nil, errors.New("kubelock-dev --node not ready after 10 minutes")
	}
	fmt.Printf("cluster suite: kubelock-dev --node ready after %s\n", time.Since(started).Round(10*time.Millisecond))

	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dataDir, "kubeconfig"))
	if err != nil {
		return dev, err
	}
	scheme, err := operator.Scheme()
	if err != nil {
		return dev, err
	}
	if c, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		return dev, err
	}
	return dev, nil
}

// stopCluster stops kubelock-dev with SIGINT, as Ctrl-C does, and checks
// that the host is as before: no node lock or state, no pod cgroups, no
// bridge, no mount under the data folder.
func stopCluster(dev *exec.Cmd) error {
	started := time.Now()
	_ = dev.Process.Signal(syscall.SIGINT)
	done := make(chan error, 1)
	go func() { done <- dev.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("kubelock-dev --node on SIGINT: %w", err)
		}
	case <-time.After(2 * time.Minute):
		_ = dev.Process.Kill()
		return errors.New("kubelock-dev --node did not stop within 2 minutes of SIGINT")
	}
	fmt.Printf("cluster suite: kubelock-dev --node stopped and cleaned up in %s\n", time.Since(started).Round(10*time.Millisecond))
	var errs []error
	if _, err := os.Stat("/run/kubelock-dev/node.json"); err == nil {
		errs = append(errs, errors.New("the node's host state record is still there"))
	}
	if dirs, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods"); len(dirs) > 0 {
		errs = append(errs, fmt.Errorf("pod cgroups left: %v", dirs))
	}
	if _, err := net.InterfaceByName("kubelock0"); err == nil {
		errs = append(errs, errors.New("the bridge kubelock0 is still there"))
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	if strings.Contains(string(mounts), dataDir) {
		errs = append(errs, errors.New("mounts under the data folder are left"))
	}
	if out, err := exec.Command("iptables-save").Output(); err == nil && regexp.MustCompile(`(?m)^:(KUBE|CNI)-`).Match(out) {
		errs = append(errs, errors.New("KUBE-* or CNI-* iptables chains are left"))
	}
	return errors.Join(errs...)
}

func requireCluster(t *testing.T) context.Context {
	t.Helper()
	if skipReason != "" {
		t.Skip("SKIPPED, NOT PASSED: " + skipReason)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// eventually polls cond every interval until it returns true, failing the
// test with cond's last error after timeout.
func eventually(ctx context.Context, t *testing.T, interval, timeout time.Duration, cond func(context.Context) (bool, error)) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(ctx, interval, timeout, true, func(ctx context.Context) (bool, error) {
		ok, err := cond(ctx)
		last = err
		return ok, nil
	})
	if err != nil {
		t.Fatalf("%v: %v", err, last)
	}
}

func deploymentAvailable(ns, name string) func(context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		d := &appsv1.Deployment{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, d); err != nil {
			return false, err
		}
		want := *d.Spec.Replicas
		s := d.Status
		return s.AvailableReplicas == want && s.UpdatedReplicas == want && s.Replicas == want,
			fmt.Errorf("%d/%d available, %d replicas", s.AvailableReplicas, want, s.Replicas)
	}
}

func TestOperatorDeploymentReady(t *testing.T) {
	ctx := requireCluster(t)
	eventually(ctx, t, 200*time.Millisecond, time.Minute, deploymentAvailable(devenv.OperatorNamespace, devenv.OperatorDeployment))
	pods := &corev1.PodList{}
	if err := c.List(ctx, pods, client.InNamespace(devenv.OperatorNamespace)); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		for _, cs := range p.Status.ContainerStatuses {
			if cs.ImageID == "" || !cs.Ready {
				t.Errorf("pod %s container %s: ready %v, image %q", p.Name, cs.Name, cs.Ready, cs.Image)
			}
		}
	}
}

// TestWebhookServedThroughItsService: the apiserver calls the operator's
// webhooks through the Service, with the caBundle the operator injected. On
// the crd backend the lock rules are a webhook and deny a forged waiter; on
// the apiserver backend kubelock-apiserver runs them in-process, and the
// operator's webhook serves fenced objects only. Both deny a fenced object
// written without a token.
func TestWebhookServedThroughItsService(t *testing.T) {
	ctx := requireCluster(t)
	names := []string{devenv.FencedWebhookConfigName}
	if !apiserverBackend() {
		names = append(names, devenv.WebhookConfigName)
	}
	for _, name := range names {
		vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
		if err := c.Get(ctx, client.ObjectKey{Name: name}, vwc); err != nil {
			t.Fatal(err)
		}
		for _, w := range vwc.Webhooks {
			if s := w.ClientConfig.Service; s == nil || s.Name != "kubelock-webhook-service" || w.ClientConfig.URL != nil || len(w.ClientConfig.CABundle) == 0 {
				t.Errorf("%s: webhook %s: clientConfig %+v, want the Service kubelock-webhook-service with an injected caBundle", name, w.Name, w.ClientConfig)
			}
		}
	}
	// A waiter written in someone else's name is denied by the lock rules only.
	denied(ctx, t)
	// A fenced ConfigMap without a token, by the fenced-objects webhook only.
	eventually(ctx, t, 100*time.Millisecond, time.Minute, func(ctx context.Context) (bool, error) {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
			Namespace: "default", Name: "cluster-suite-fenced",
			Labels:      map[string]string{locksv1alpha1.FencedLabel: "true"},
			Annotations: map[string]string{locksv1alpha1.FencedByAnnotation: devenv.DemoLock},
		}}
		err := c.Create(ctx, cm, client.DryRunAll)
		if err == nil {
			return false, errors.New("a fenced ConfigMap without a token was admitted")
		}
		return strings.Contains(err.Error(), "[kubelock:stale-token]"), err
	})
}

// apiserverBackend says whether the suite runs on the apiserver backend.
func apiserverBackend() bool { return os.Getenv(backendEnv) == devenv.BackendAPIServer }

// leaderPod is the operator pod that leads.
func leaderPod(ctx context.Context) (string, error) {
	pod, _, err := leadership(ctx)
	return pod, err
}

// leadership is the operator's leading pod and its term, read from the
// election its replicas run: a DistributedLock (the chart's default, and
// what kubelock-dev installs on the apiserver backend) or a Lease
// (config/default). The term changes when leadership moves, also when the
// same pod takes it again (a new holding of the lock; a new process's
// identity and a transition on the Lease), not when the leader renews.
func leadership(ctx context.Context) (pod, term string, err error) {
	onLock, err := operatorPods(ctx, "--leader-election-lock=kubelock")
	if err != nil {
		return "", "", err
	}
	if len(onLock) > 0 {
		l := &locksv1alpha1.DistributedLock{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: devenv.OperatorNamespace, Name: electionLock}, l); err != nil {
			return "", "", err
		}
		if l.Status.Holder == nil {
			return "", "", errors.New("no leader")
		}
		h := l.Status.Holder
		return h.Identity, fmt.Sprintf("%s (lease %s, token %d)", h.Identity, h.LeaseID, l.Status.FencingToken), nil
	}
	l := &coordinationv1.Lease{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: devenv.OperatorNamespace, Name: electionLock}, l); err != nil {
		return "", "", err
	}
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
		return "", "", errors.New("no leader")
	}
	pod, _, _ = strings.Cut(*l.Spec.HolderIdentity, "_")
	return pod, fmt.Sprintf("%s (%d transitions)", *l.Spec.HolderIdentity, ptr.Deref(l.Spec.LeaseTransitions, 0)), nil
}

// denied checks that the apiserver calls the webhook: a dry-run waiter in
// someone else's name is denied with a [kubelock:...] rule.
func denied(ctx context.Context, t *testing.T) {
	t.Helper()
	eventually(ctx, t, 100*time.Millisecond, time.Minute, func(ctx context.Context) (bool, error) {
		l := &locksv1alpha1.DistributedLock{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: devenv.DemoLock}, l); err != nil {
			return false, err
		}
		now := metav1.NowMicro()
		l.Status.Waiters = append(l.Status.Waiters, locksv1alpha1.Waiter{
			Identity: "cluster-suite", User: "cluster-suite", RequestID: "cluster-suite",
			EnqueueTime: now, Deadline: metav1.NewMicroTime(now.Add(time.Minute)),
		})
		l.Status.WaiterCount = int32(len(l.Status.Waiters))
		err := c.Status().Update(ctx, l, client.DryRunAll)
		if err == nil {
			return false, errors.New("a write the webhook must deny was admitted")
		}
		return strings.Contains(err.Error(), "[kubelock:"), err
	})
}

func TestLeaderFailover(t *testing.T) {
	ctx := requireCluster(t)
	holder := leaderPod
	var leader string
	eventually(ctx, t, 200*time.Millisecond, time.Minute, func(ctx context.Context) (bool, error) {
		var err error
		leader, err = holder(ctx)
		return err == nil, err
	})
	started := time.Now()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: devenv.OperatorNamespace, Name: leader}}
	if err := c.Delete(ctx, pod); err != nil {
		t.Fatal(err)
	}
	var next string
	eventually(ctx, t, 100*time.Millisecond, 90*time.Second, func(ctx context.Context) (bool, error) {
		var err error
		next, err = holder(ctx)
		return err == nil && next != leader, err
	})
	t.Logf("leader %s deleted; %s leads after %s", leader, next, time.Since(started).Round(10*time.Millisecond))
	eventually(ctx, t, 200*time.Millisecond, 2*time.Minute, deploymentAvailable(devenv.OperatorNamespace, devenv.OperatorDeployment))
	denied(ctx, t)
}

// record is one line the app wrote: start or stop, when, the token then ("none": no token file).
type record struct {
	event string
	at    time.Time
	token string
}

func records(t *testing.T, dir, pod string) []record {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, pod))
	if err != nil {
		return nil
	}
	var out []record
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		ns, _ := strconv.ParseInt(f[1], 10, 64)
		out = append(out, record{f[0], time.Unix(0, ns), f[2]})
	}
	return out
}

func TestSidecarSample(t *testing.T) {
	ctx := requireCluster(t)
	recDir, db, lockObj := recordDir(t), database(ctx, t), sampleLock(ctx, t, "orders-db")
	d := &appsv1.Deployment{}
	readSample(t, "deployment_sidecar.yaml", d)
	recording(&d.Spec.Template.Spec, recDir, db.dsn)
	started := time.Now()
	if err := c.Create(ctx, d); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), d) })

	// One pod holds the lock and is Ready; its app started with the token
	// file already there. The other waits: not Ready, its app not started.
	lock := func(ctx context.Context) (*locksv1alpha1.DistributedLock, error) {
		l := &locksv1alpha1.DistributedLock{}
		return l, c.Get(ctx, client.ObjectKeyFromObject(lockObj), l)
	}
	var holderPod, waiterPod string
	var token int64
	eventually(ctx, t, 200*time.Millisecond, 2*time.Minute, func(ctx context.Context) (bool, error) {
		l, err := lock(ctx)
		if err != nil || l.Status.Holder == nil {
			return false, errors.Join(errors.New("no holder yet"), err)
		}
		holderPod, token = l.Status.Holder.PodName, l.Status.FencingToken
		pods := &corev1.PodList{}
		if err := c.List(ctx, pods, client.InNamespace("default"), client.MatchingLabels{"app": "orders-writer"}); err != nil {
			return false, err
		}
		ready := map[string]bool{}
		for _, p := range pods.Items {
			for _, cond := range p.Status.Conditions {
				if cond.Type == corev1.PodReady {
					ready[p.Name] = cond.Status == corev1.ConditionTrue
				}
			}
			if p.Name != holderPod && p.DeletionTimestamp == nil {
				waiterPod = p.Name
			}
		}
		recs := records(t, recDir, holderPod)
		return len(pods.Items) == 2 && ready[holderPod] && !ready[waiterPod] && waiterPod != "" && len(recs) > 0,
			fmt.Errorf("holder %s, waiter %s, ready %v, records %v", holderPod, waiterPod, ready, recs)
	})
	t.Logf("first holder %s (token %d) Ready %s after the Deployment was created", holderPod, token, time.Since(started).Round(10*time.Millisecond))
	if r := records(t, recDir, holderPod)[0]; r.event != "start" || r.token != strconv.FormatInt(token, 10) {
		t.Fatalf("the holder's app started with token %q, want %d: the sidecar must acquire before the main container starts", r.token, token)
	}
	if recs := records(t, recDir, waiterPod); len(recs) > 0 {
		t.Fatalf("the waiting pod's app started without the lock: %v", recs)
	}

	// Deleting the holder: its app stops first (the token file still there),
	// then the sidecar releases, and the other pod's sidecar takes the lock
	// with a higher token; its app then starts with that token.
	deleted := time.Now()
	if err := c.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: holderPod}}); err != nil {
		t.Fatal(err)
	}
	var next *locksv1alpha1.DistributedLock
	eventually(ctx, t, 20*time.Millisecond, 2*time.Minute, func(ctx context.Context) (bool, error) {
		l, err := lock(ctx)
		if err != nil {
			return false, err
		}
		next = l
		return l.Status.Holder != nil && l.Status.Holder.PodName == waiterPod, fmt.Errorf("holder %+v", l.Status.Holder)
	})
	handover := time.Since(deleted)
	t.Logf("holder pod deleted; %s holds the lock with token %d after %s (was %d)", waiterPod, next.Status.FencingToken, handover.Round(time.Millisecond), token)
	if next.Status.FencingToken <= token {
		t.Fatalf("the next holder's token %d is not above %d", next.Status.FencingToken, token)
	}
	stop := records(t, recDir, holderPod)
	if len(stop) != 2 || stop[1].event != "stop" || stop[1].token != strconv.FormatInt(token, 10) {
		t.Fatalf("the deleted holder's app records %v: want a stop while the token file still held %d", stop, token)
	}
	var released time.Time
	for _, h := range next.Status.RecentAcquisitions {
		if h.FencingToken == token {
			released = h.EndTime.Time
		}
	}
	if released.IsZero() || !stop[1].at.Before(released) {
		t.Fatalf("the sidecar released at %v, the app stopped at %v: the main container must stop first", released, stop[1].at)
	}
	t.Logf("the app stopped %s after the delete; the sidecar released %s after the app stopped", stop[1].at.Sub(deleted).Round(time.Millisecond), released.Sub(stop[1].at).Round(time.Millisecond))
	eventually(ctx, t, 200*time.Millisecond, time.Minute, func(ctx context.Context) (bool, error) {
		recs := records(t, recDir, waiterPod)
		return len(recs) == 1 && recs[0].token == strconv.FormatInt(next.Status.FencingToken, 10), fmt.Errorf("records %v", recs)
	})

	// Two replicas never run their critical sections at once: through more
	// hand-overs, every fenced row the apps wrote is accepted (no stale
	// token), and the rows' tokens only rise, one pod per token.
	holderPod = waiterPod
	for range 2 {
		token = next.Status.FencingToken
		db.waitRows(ctx, t, token)
		if err := c.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: holderPod}}); err != nil {
			t.Fatal(err)
		}
		eventually(ctx, t, 50*time.Millisecond, 2*time.Minute, func(ctx context.Context) (bool, error) {
			l, err := lock(ctx)
			if err != nil {
				return false, err
			}
			next = l
			return l.Status.Holder != nil && l.Status.Holder.PodName != holderPod && l.Status.FencingToken > token, fmt.Errorf("holder %+v", l.Status.Holder)
		})
		holderPod = next.Status.Holder.PodName
	}
	db.waitRows(ctx, t, next.Status.FencingToken)
	db.checkRows(ctx, t, 4)
	checkNoStale(t, recDir)

	// Pod-bound: the holder's sidecar holds the lock in a session its pod owns.
	// With the sidecar frozen (it can release nothing) and the pod deleted at
	// once, the garbage collector deletes the session and the controller frees
	// the lock for the other pod.
	token, holderPod = next.Status.FencingToken, next.Status.Holder.PodName
	session := next.Status.Holder.Session
	if session == "" {
		t.Fatalf("the holder %s holds the lock outside a session", holderPod)
	}
	pid := sidecarPid(t, holderPod)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	deleted = time.Now()
	if err := c.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: holderPod}}, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	eventually(ctx, t, 20*time.Millisecond, time.Minute, func(ctx context.Context) (bool, error) {
		l, err := lock(ctx)
		if err != nil {
			return false, err
		}
		next = l
		return l.Status.Holder != nil && l.Status.Holder.PodName != holderPod && l.Status.FencingToken > token, fmt.Errorf("holder %+v", l.Status.Holder)
	})
	freed := time.Since(deleted)
	t.Logf("pod-bound: %s (sidecar frozen) force-deleted; its session %s went and %s holds with token %d after %s", holderPod, session, next.Status.Holder.PodName, next.Status.FencingToken, freed.Round(time.Millisecond))
	if freed > 2*time.Second {
		t.Errorf("the pod-bound session's lock was freed %s after its pod was deleted, want within 2s", freed)
	}
	db.waitRows(ctx, t, next.Status.FencingToken)
	db.checkRows(ctx, t, 5) // the frozen pod's app may still try: its writes are refused
}

// sidecarPid is the process of the kubelock sidecar in pod, found through
// its environment (this suite runs on the node, as root).
func sidecarPid(t *testing.T, pod string) int {
	t.Helper()
	pid := findProcess(t, func(args, env []string) bool {
		return len(args) > 1 && args[0] == "/kubelock" && args[1] == "sidecar" && slices.Contains(env, "POD_NAME="+pod)
	})
	if pid == 0 {
		t.Fatalf("no sidecar process of pod %s", pod)
	}
	return pid
}

// findProcess is the first process whose arguments and environment match (0 if none).
func findProcess(t *testing.T, match func(args, env []string) bool) int {
	t.Helper()
	procs, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		env, _ := os.ReadFile(filepath.Join("/proc", p.Name(), "environ"))
		if match(strings.Split(string(cmdline), "\x00"), strings.Split(string(env), "\x00")) {
			return pid
		}
	}
	return 0
}

// recording mounts recDir at /record into the pod's first container and sets
// the app's RECORD_DIR, POD_NAME and PG_DSN.
func recording(spec *corev1.PodSpec, recDir, dsn string) {
	app := &spec.Containers[0]
	app.Env = append(app.Env, corev1.EnvVar{Name: "RECORD_DIR", Value: "/record"}, corev1.EnvVar{Name: "PG_DSN", Value: dsn})
	if !slices.ContainsFunc(app.Env, func(e corev1.EnvVar) bool { return e.Name == "POD_NAME" }) {
		app.Env = append(app.Env, corev1.EnvVar{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}})
	}
	app.VolumeMounts = append(app.VolumeMounts, corev1.VolumeMount{Name: "record", MountPath: "/record"})
	spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "record", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: recDir}}})
}

func recordDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o777); err != nil { // the app runs as 65532
		t.Fatal(err)
	}
	return dir
}

// checkNoStale fails when an app recorded a write refused for a stale token.
func checkNoStale(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		for _, r := range records(t, dir, e.Name()) {
			if r.event == "stale" || r.event == "error" {
				t.Errorf("pod %s: %s with token %s at %v", e.Name(), r.event, r.token, r.at)
			}
		}
	}
}

// createSidecarSample points a sidecar sample's Deployment d at lock name
// (the sidecar's key and the app's token file) and creates it, deleted when
// the test ends.
func createSidecarSample(ctx context.Context, t *testing.T, d *appsv1.Deployment, name string) {
	t.Helper()
	sidecar, app := &d.Spec.Template.Spec.InitContainers[0], &d.Spec.Template.Spec.Containers[0]
	sidecar.Args[slices.Index(sidecar.Args, "orders-db")] = name
	app.Env[0].Value = "/run/kubelock/" + name + "/token"
	if err := c.Create(ctx, d); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), d) })
}

// sampleLock creates the sample lock (config/samples) named name.
func sampleLock(ctx context.Context, t *testing.T, name string) *locksv1alpha1.DistributedLock {
	t.Helper()
	l := &locksv1alpha1.DistributedLock{}
	readSample(t, "locks_v1alpha1_distributedlock.yaml", l)
	if l.Name != name {
		l.Name = name
		delete(l.Annotations, locksv1alpha1.KeyAnnotation)
	}
	if err := c.Create(ctx, l); err != nil {
		t.Fatal(err)
	}
	return l
}

func readSample(t *testing.T, name string, into any) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "samples", name))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, into); err != nil {
		t.Fatal(err)
	}
}

// db is a PostgreSQL database on the host that the pods write fenced rows to.
type db struct {
	dsn  string
	conn *pgx.Conn
}

// database starts PostgreSQL listening on the node's address too, with the
// fence table and the apps' rows table.
func database(ctx context.Context, t *testing.T) *db {
	t.Helper()
	var nodeIP string
	for _, a := range theNode(ctx, t).Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			nodeIP = a.Address
		}
	}
	srv, err := pgtest.Start(ctx, nodeIP)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	dsn, err := srv.CreateDatabase(ctx, "cluster")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	if err := postgres.NewGuard(conn).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE rows (id bigserial PRIMARY KEY, pod text NOT NULL, token bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return &db{dsn: strings.Replace(dsn, "127.0.0.1", nodeIP, 1), conn: conn}
}

// waitRows waits for a row with token.
func (d *db) waitRows(ctx context.Context, t *testing.T, token int64) {
	t.Helper()
	eventually(ctx, t, 100*time.Millisecond, time.Minute, func(ctx context.Context) (bool, error) {
		var n int
		err := d.conn.QueryRow(ctx, `SELECT count(*) FROM rows WHERE token = $1`, token).Scan(&n)
		return n > 0, errors.Join(err, fmt.Errorf("%d rows with token %d", n, token))
	})
}

// checkRows checks the rows in the order they were written: tokens never go
// down, each token is one pod's, and there are at least holders tokens.
func (d *db) checkRows(ctx context.Context, t *testing.T, holders int) {
	t.Helper()
	rows, err := d.conn.Query(ctx, `SELECT pod, token FROM rows ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	podOf := map[int64]string{}
	var last int64
	n := 0
	for rows.Next() {
		var pod string
		var token int64
		if err := rows.Scan(&pod, &token); err != nil {
			t.Fatal(err)
		}
		n++
		if token < last {
			t.Fatalf("row %d: token %d after %d: two holders wrote at once", n, token, last)
		}
		if p, seen := podOf[token]; seen && p != pod {
			t.Fatalf("token %d written by %s and %s", token, p, pod)
		}
		podOf[token], last = pod, token
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(podOf) < holders {
		t.Fatalf("rows of %d holders (%v), want %d", len(podOf), podOf, holders)
	}
	t.Logf("%d fenced rows from %d holders in turn, tokens only rising", n, len(podOf))
}

// TestJobKubelockRun runs the Job sample with three parallel pods: each
// `kubelock run` waits for the lock, runs the app (1 s of fenced writes) with
// its token, and releases; the pods take turns and never overlap.
func TestJobKubelockRun(t *testing.T) {
	ctx := requireCluster(t)
	recDir, db, lockObj := recordDir(t), database(ctx, t), sampleLock(ctx, t, "migrations")
	job := &batchv1.Job{}
	readSample(t, "job_kubelock_run.yaml", job)
	three := int32(3)
	job.Spec.Parallelism, job.Spec.Completions = &three, &three
	spec := &job.Spec.Template.Spec
	mig := &spec.Containers[0]
	mig.Command[slices.Index(mig.Command, "orders-db")] = lockObj.Name
	recording(spec, recDir, db.dsn)
	started := time.Now()
	if err := c.Create(ctx, job); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Delete(context.Background(), job, client.PropagationPolicy(metav1.DeletePropagationBackground))
	})
	eventually(ctx, t, 200*time.Millisecond, 3*time.Minute, func(ctx context.Context) (bool, error) {
		j := &batchv1.Job{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(job), j); err != nil {
			return false, err
		}
		if j.Status.Failed > 0 {
			return false, fmt.Errorf("%d pods failed", j.Status.Failed)
		}
		return j.Status.Succeeded == 3, fmt.Errorf("%d of 3 succeeded", j.Status.Succeeded)
	})
	t.Logf("3 Job pods done after %s", time.Since(started).Round(10*time.Millisecond))

	// Each pod's run, in start order: it starts after the previous one
	// stopped, with a higher token.
	type span struct {
		pod         string
		start, stop record
	}
	var spans []span
	entries, err := os.ReadDir(recDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		recs := records(t, recDir, e.Name())
		if len(recs) != 2 || recs[0].event != "start" || recs[1].event != "stop" {
			t.Fatalf("pod %s records %v, want a start and a stop", e.Name(), recs)
		}
		spans = append(spans, span{e.Name(), recs[0], recs[1]})
	}
	if len(spans) != 3 {
		t.Fatalf("%d pods recorded, want 3", len(spans))
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].start.at.Before(spans[j].start.at) })
	for i := 1; i < len(spans); i++ {
		prev, cur := spans[i-1], spans[i]
		pt, _ := strconv.ParseInt(prev.start.token, 10, 64)
		ct, _ := strconv.ParseInt(cur.start.token, 10, 64)
		if cur.start.at.Before(prev.stop.at) || ct <= pt {
			t.Fatalf("%s ran from %v with token %d, before %s (token %d) stopped at %v", cur.pod, cur.start.at, ct, prev.pod, pt, prev.stop.at)
		}
		t.Logf("%s started %s after %s stopped, token %d > %d", cur.pod, cur.start.at.Sub(prev.stop.at).Round(time.Millisecond), prev.pod, ct, pt)
	}
	db.checkRows(ctx, t, 3)
	checkNoStale(t, recDir)
}

// TestKubeletRestart stops and restarts the kubelet (SIGUSR1 to kubelock-dev):
// the pods' containers run on (same container IDs, no restarts), a sidecar's
// holding continues past a lease (same lease, same token) because the sidecar
// never stopped renewing, and the operator keeps its leader.
func TestKubeletRestart(t *testing.T) {
	ctx := requireCluster(t)
	lockObj := sampleLock(ctx, t, "node-restart")
	d := &appsv1.Deployment{}
	readSample(t, "deployment_sidecar.yaml", d)
	one, labels := int32(1), map[string]string{"app": "node-restart"}
	d.Name, d.Spec.Replicas, d.Spec.Selector.MatchLabels, d.Spec.Template.Labels = "node-restart", &one, labels, labels
	createSidecarSample(ctx, t, d, lockObj.Name)
	eventually(ctx, t, 200*time.Millisecond, 2*time.Minute, deploymentAvailable("default", d.Name))

	type snapshot struct {
		containers map[string]string // namespace/pod/container: its ID and restart count
		lease      string
		token      int64
		leader     string // the operator's leader and its term (leadership)
	}
	snap := func(ctx context.Context) (snapshot, error) {
		s := snapshot{containers: map[string]string{}}
		for _, sel := range []client.ListOption{client.MatchingLabels(labels), client.InNamespace(devenv.OperatorNamespace)} {
			pods := &corev1.PodList{}
			if err := c.List(ctx, pods, sel); err != nil {
				return s, err
			}
			for _, p := range pods.Items {
				ready := false
				for _, cond := range p.Status.Conditions {
					ready = ready || cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue
				}
				if !ready {
					return s, fmt.Errorf("pod %s not Ready", p.Name)
				}
				for _, cs := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
					s.containers[p.Namespace+"/"+p.Name+"/"+cs.Name] = fmt.Sprintf("%s restarts %d", cs.ContainerID, cs.RestartCount)
				}
			}
		}
		l := &locksv1alpha1.DistributedLock{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(lockObj), l); err != nil {
			return s, err
		}
		if l.Status.Holder == nil {
			return s, errors.New("lock not held")
		}
		s.lease, s.token = l.Status.Holder.LeaseID, l.Status.FencingToken
		_, leader, err := leadership(ctx)
		s.leader = leader
		return s, err
	}
	var before snapshot
	eventually(ctx, t, 200*time.Millisecond, time.Minute, func(ctx context.Context) (bool, error) {
		var err error
		before, err = snap(ctx)
		return err == nil && before.leader != "", err
	})

	node, oldPid := theNode(ctx, t).Name, kubeletPid(t)
	restarted := time.Now()
	if err := devCmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	notReady := false
	eventually(ctx, t, 100*time.Millisecond, time.Minute, func(ctx context.Context) (bool, error) {
		n := &corev1.Node{}
		if err := c.Get(ctx, client.ObjectKey{Name: node}, n); err == nil {
			for _, cond := range n.Status.Conditions {
				notReady = notReady || cond.Type == corev1.NodeReady && cond.Status != corev1.ConditionTrue
			}
		}
		pid := kubeletPid(t)
		return pid != 0 && pid != oldPid && kubeletHealthy(ctx), fmt.Errorf("kubelet pid %d (was %d)", pid, oldPid)
	})
	t.Logf("kubelet restarted and healthy after %s (node NotReady seen: %v)", time.Since(restarted).Round(10*time.Millisecond), notReady)

	// Past a whole lease (the sample's --lease=15s) after the kubelet stopped,
	// everything is as before and Ready again.
	time.Sleep(time.Until(restarted.Add(16 * time.Second)))
	var after snapshot
	eventually(ctx, t, 200*time.Millisecond, time.Minute, func(ctx context.Context) (bool, error) {
		var err error
		after, err = snap(ctx)
		return err == nil, err
	})
	for k, v := range before.containers {
		if after.containers[k] != v {
			t.Errorf("container %s: %s before the kubelet restart, %q after", k, v, after.containers[k])
		}
	}
	if after.lease != before.lease || after.token != before.token {
		t.Errorf("the sidecar's holding: lease %s token %d before, lease %s token %d after", before.lease, before.token, after.lease, after.token)
	}
	if after.leader != before.leader {
		t.Errorf("the operator's leadership: %s before, %s after", before.leader, after.leader)
	}
	t.Logf("%d containers kept running; lease %s token %d held throughout; operator leader %s kept", len(before.containers), after.lease, after.token, after.leader)
}

// kubeletPid is the kubelet's process (0 if none), found by its root folder.
func kubeletPid(t *testing.T) int {
	t.Helper()
	return findProcess(t, func(args, _ []string) bool {
		return filepath.Base(args[0]) == "kubelet" && slices.Contains(args, "--root-dir="+filepath.Join(dataDir, "node", "kubelet"))
	})
}

func kubeletHealthy(ctx context.Context) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:10248/healthz", nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// theNode is the cluster's one node.
func theNode(ctx context.Context, t *testing.T) *corev1.Node {
	t.Helper()
	nodes := &corev1.NodeList{}
	if err := c.List(ctx, nodes); err != nil || len(nodes.Items) != 1 {
		t.Fatalf("nodes: %v %v", nodes.Items, err)
	}
	return &nodes.Items[0]
}
