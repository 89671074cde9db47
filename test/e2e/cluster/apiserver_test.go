//go:build cluster

package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/cmd/kubelock-dev/devenv"
	"github.com/kubelock/kubelock/pkg/lock"
)

// backendEnv chooses the suite's backend (kubelock-dev --backend):
// CLUSTER_BACKEND=apiserver runs the whole suite on the chart's
// kubelock-apiserver and its etcd as pods.
const backendEnv = "CLUSTER_BACKEND"

// requireAPIServerBackend is requireCluster for the apiserver backend's specs.
func requireAPIServerBackend(t *testing.T) context.Context {
	t.Helper()
	ctx := requireCluster(t)
	if b := os.Getenv(backendEnv); b != devenv.BackendAPIServer {
		t.Skipf("SKIPPED, NOT PASSED: the suite runs the %q backend; %s=%s runs this spec", b, backendEnv, devenv.BackendAPIServer)
	}
	return ctx
}

// TestChartAPIServerBackend: kubelock-dev installed the chart with
// backend=apiserver on the node. No lock CRD exists; kube-apiserver serves
// the lock API through the APIService, whose caBundle the operator's rotation
// injected, from kubelock-apiserver's replicas and their etcd, all pods. A
// lock user acquires and releases a lock through it, and does again while
// one kubelock-apiserver replica is deleted under load: four workers taking
// and releasing locks lose no operation, and the user's reads none, while it
// goes (serving out its shutdown delay) and is replaced.
func TestChartAPIServerBackend(t *testing.T) {
	ctx := requireAPIServerBackend(t)

	crd := &unstructured.Unstructured{}
	crd.SetAPIVersion("apiextensions.k8s.io/v1")
	crd.SetKind("CustomResourceDefinition")
	if err := c.Get(ctx, client.ObjectKey{Name: "distributedlocks.locks.kubelock.io"}, crd); !apierrors.IsNotFound(err) {
		t.Errorf("the lock CRD: %v, want NotFound (the APIService serves the group version)", err)
	}
	as := &unstructured.Unstructured{}
	as.SetAPIVersion("apiregistration.k8s.io/v1")
	as.SetKind("APIService")
	eventually(ctx, t, 200*time.Millisecond, time.Minute, func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKey{Name: "v1alpha1.locks.kubelock.io"}, as); err != nil {
			return false, err
		}
		svc, _, _ := unstructured.NestedString(as.Object, "spec", "service", "name")
		ca, _, _ := unstructured.NestedString(as.Object, "spec", "caBundle")
		conditions, _, _ := unstructured.NestedSlice(as.Object, "status", "conditions")
		available := false
		for _, cond := range conditions {
			if m, ok := cond.(map[string]any); ok && m["type"] == "Available" && m["status"] == "True" {
				available = true
			}
		}
		return svc == devenv.APIServerDeployment && ca != "" && available,
			fmt.Errorf("service %q, caBundle of %d bytes, conditions %v", svc, len(ca), conditions)
	})
	eventually(ctx, t, 200*time.Millisecond, time.Minute, deploymentAvailable(devenv.OperatorNamespace, devenv.APIServerDeployment))
	sts := &appsv1.StatefulSet{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: devenv.OperatorNamespace, Name: "kubelock-etcd"}, sts); err != nil {
		t.Fatal(err)
	}
	if sts.Status.ReadyReplicas != *sts.Spec.Replicas {
		t.Errorf("etcd StatefulSet: %d of %d members ready", sts.Status.ReadyReplicas, *sts.Spec.Replicas)
	}

	alice := lockUser(t, devenv.LockUsers[0])
	key := "served-by-kubelock-apiserver"
	first := acquireRelease(ctx, t, alice, key)

	// One replica deleted: the other serves, and the Deployment replaces it.
	pods := &corev1.PodList{}
	if err := c.List(ctx, pods, client.InNamespace(devenv.OperatorNamespace), client.MatchingLabels{"app.kubernetes.io/component": "apiserver"}); err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 2 {
		t.Fatalf("%d kubelock-apiserver pods, want 2", len(pods.Items))
	}
	load := startLoad(ctx, t, alice, 4)
	if err := c.Delete(ctx, &pods.Items[0]); err != nil {
		t.Fatal(err)
	}
	t.Logf("deleted kubelock-apiserver pod %s under load", pods.Items[0].Name)
	second := acquireRelease(ctx, t, alice, key)
	if second <= first {
		t.Errorf("fencing token %d after %d: tokens must grow", second, first)
	}
	deleted := pods.Items[0].Name
	eventually(ctx, t, 200*time.Millisecond, 3*time.Minute, func(ctx context.Context) (bool, error) {
		if err := c.List(ctx, pods, client.InNamespace(devenv.OperatorNamespace), client.MatchingLabels{"app.kubernetes.io/component": "apiserver"}); err != nil {
			return false, err
		}
		var ready []string
		gone := true
		for _, p := range pods.Items {
			if p.Name == deleted {
				gone = false // serving out its shutdown delay
			} else if p.DeletionTimestamp == nil && podReady(&p) {
				ready = append(ready, p.Name)
			}
		}
		return len(ready) == 2 && gone, fmt.Errorf("ready replicas %v (deleted %s, gone: %v)", ready, deleted, gone)
	})
	ops, errs := load()
	t.Logf("under load: %d acquire-release rounds through the APIService while a replica was deleted and replaced", ops)
	for _, err := range errs {
		t.Errorf("a lock operation failed while a replica was deleted: %v", err)
	}
	if ops < 8 {
		t.Errorf("%d acquire-release rounds under load, want at least 8: the load did not run", ops)
	}
}

// startLoad runs n workers, each acquiring, reading and releasing a key of
// its own through the APIService in a loop and checking that its tokens grow
// and that it reads its own holding, until the returned stop is called; stop
// returns the rounds done and what failed.
func startLoad(ctx context.Context, t *testing.T, cl *lock.Client, n int) (stop func() (int, []error)) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		rounds int
		errs   []error
	)
	for i := range n {
		wg.Go(func() {
			key, last := fmt.Sprintf("under-load-%d", i), int64(0)
			for ctx.Err() == nil {
				err := func() error {
					held, err := cl.Acquire(ctx, key, lock.WithLeaseDuration(30*time.Second))
					if err != nil {
						return fmt.Errorf("acquire %s: %w", key, err)
					}
					if held.FencingToken() <= last {
						return fmt.Errorf("%s: token %d after %d", key, held.FencingToken(), last)
					}
					last = held.FencingToken()
					// A read through a plain client, which does not send a
					// 503 again as Client.Get would: with the replica's
					// shutdown delay there must be none to send again.
					l := &locksv1alpha1.DistributedLock{}
					if err := c.Get(ctx, client.ObjectKey{Namespace: cl.Namespace(), Name: held.Name()}, l); err != nil {
						return fmt.Errorf("read %s: %w", key, err)
					} else if h := l.Status.Holder; h == nil || h.LeaseID != held.LeaseID() {
						return fmt.Errorf("%s read while held: holder %+v, want lease %s", key, h, held.LeaseID())
					}
					if err := held.Release(context.WithoutCancel(ctx)); err != nil {
						return fmt.Errorf("release %s: %w", key, err)
					}
					return nil
				}()
				mu.Lock()
				switch {
				case err == nil:
					rounds++
				case ctx.Err() == nil:
					errs = append(errs, err)
				}
				mu.Unlock()
			}
		})
	}
	stop = func() (int, []error) {
		cancel()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return rounds, errs
	}
	t.Cleanup(func() { stop() })
	return stop
}

// podReady says whether the pod's Ready condition is true.
func podReady(p *corev1.Pod) bool {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// lockUser is a pkg/lock client as user (a context of kubelock-dev's
// kubeconfig) in namespace default, creating locks on first use.
func lockUser(t *testing.T, user string) *lock.Client {
	t.Helper()
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: filepath.Join(dataDir, "kubeconfig")},
		&clientcmd.ConfigOverrides{CurrentContext: user}).ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	cl, err := lock.New(cfg, lock.WithNamespace("default"), lock.WithAutoCreate())
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// acquireRelease acquires key, checks the lock records the holding, releases
// it, checks the release is recorded, and returns the holding's token.
func acquireRelease(ctx context.Context, t *testing.T, cl *lock.Client, key string) int64 {
	t.Helper()
	held, err := cl.Acquire(ctx, key, lock.WithLeaseDuration(30*time.Second))
	if err != nil {
		t.Fatalf("acquire %s: %v", key, err)
	}
	l, err := cl.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if h := l.Status.Holder; h == nil || h.LeaseID != held.LeaseID() || l.Status.FencingToken != held.FencingToken() {
		t.Errorf("after acquiring: holder %+v, token %d; want lease %s with token %d", h, l.Status.FencingToken, held.LeaseID(), held.FencingToken())
	}
	if err := held.Release(ctx); err != nil {
		t.Fatalf("release %s: %v", key, err)
	}
	if l, err = cl.Get(ctx, key); err != nil {
		t.Fatal(err)
	}
	if f := l.Status.FindFinished(held.RequestID()); l.Status.Holder != nil || f == nil || f.EndReason != locksv1alpha1.EndReasonReleased {
		t.Errorf("after releasing: holder %+v, the holding ended as %+v; want none and Released", l.Status.Holder, f)
	}
	t.Logf("%s acquired with token %d and released through kubelock-apiserver", key, held.FencingToken())
	return held.FencingToken()
}

// TestSidecarStraightToTheLockServer runs the sample whose sidecars send
// their lock requests straight to kubelock-apiserver (--lock-server=auto):
// with the chart's discovery grant, each pod's service account finds the
// Service and its CA from the APIService, and kube-proxy takes the requests
// to a replica. One pod holds the lock as itself and says where its requests
// go; when it is deleted, the other takes over with a higher token.
func TestSidecarStraightToTheLockServer(t *testing.T) {
	ctx := requireAPIServerBackend(t)
	lockObj := sampleLock(ctx, t, "straight-to-the-lock-server")
	d := &appsv1.Deployment{}
	readSample(t, "deployment_sidecar_lock_server.yaml", d)
	createSidecarSample(ctx, t, d, lockObj.Name)

	svc := &corev1.Service{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: devenv.OperatorNamespace, Name: devenv.APIServerDeployment}, svc); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("lock requests go straight to the lock server at https://%s:443 (%s.%s.svc, from the APIService %s)",
		svc.Spec.ClusterIP, devenv.APIServerDeployment, devenv.OperatorNamespace, locksv1alpha1.APIServiceName)
	// holding waits until a Ready pod of the Deployment other than gone holds
	// the lock, as the sample's service account, and returns it and its token.
	holding := func(gone string) (string, int64) {
		var pod string
		var token int64
		eventually(ctx, t, 200*time.Millisecond, 2*time.Minute, func(ctx context.Context) (bool, error) {
			l := &locksv1alpha1.DistributedLock{}
			if err := c.Get(ctx, client.ObjectKeyFromObject(lockObj), l); err != nil {
				return false, err
			}
			h := l.Status.Holder
			if h == nil || h.Identity == gone {
				return false, fmt.Errorf("holder %+v", h)
			}
			if h.User != "system:serviceaccount:default:kubelock-worker" {
				return false, fmt.Errorf("holder %s is user %s, want the sample's service account", h.Identity, h.User)
			}
			p := &corev1.Pod{}
			if err := c.Get(ctx, client.ObjectKey{Namespace: d.Namespace, Name: h.Identity}, p); err != nil {
				return false, err
			}
			pod, token = p.Name, l.Status.FencingToken
			return podReady(p), fmt.Errorf("holder %s not Ready", p.Name)
		})
		return pod, token
	}
	first, token := holding("")
	logs, err := clientset(t).CoreV1().Pods(d.Namespace).GetLogs(first, &corev1.PodLogOptions{Container: d.Spec.Template.Spec.InitContainers[0].Name}).DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(logs), want) {
		t.Fatalf("the holder's sidecar logged:\n%s\nwant the line %q", logs, want)
	}
	if err := c.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: d.Namespace, Name: first}}); err != nil {
		t.Fatal(err)
	}
	second, next := holding(first)
	if next <= token {
		t.Errorf("%s took over from %s with token %d after %d: tokens must grow", second, first, next, token)
	}
	t.Logf("%s held the lock straight through %s with token %d; %s took over with %d", first, svc.Spec.ClusterIP, token, second, next)
}
