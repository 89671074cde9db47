package devenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// lockAPIServerDenial is what kubelock-apiserver's denial of a write says: a
// 403 (`... "demo" is forbidden: status.waiters[0].user: Forbidden:
// [kubelock:identity] ...`); waitAdmission also wants the rule's tag.
const lockAPIServerDenial = "is forbidden: "

// checkChart finds what --backend apiserver on the node needs besides the
// node's binaries: helm (`make helm`) and the static etcd of its image
// (`make node`).
func (e *env) checkChart() error {
	e.helm = os.Getenv("HELM")
	if e.helm == "" {
		found, _ := filepath.Glob(filepath.Join(e.root, "bin", "helm-v*"))
		sort.Strings(found)
		if len(found) > 0 {
			e.helm = found[len(found)-1]
		}
	}
	if _, err := os.Stat(e.helm); e.helm == "" || err != nil {
		return errors.New("--backend apiserver with --node installs dist/chart with helm: build it with `make helm` (or set HELM)")
	}
	etcd := filepath.Join(e.o.NodeDir, "etcd")
	if _, err := os.Stat(etcd); err != nil {
		return fmt.Errorf("--backend apiserver with --node needs the static etcd of its store's image at %s: build it with `make node`", etcd)
	}
	return nil
}

// ChartValues are what the node needs beyond backend=apiserver: the
// namespace helm creates, the images imported (never pulled), fenced objects
// (as config/fenced-objects on the CRD backend) and, with no cluster DNS and no volume provisioner, one etcd
// member on its pod IP with its data in an emptyDir.
var ChartValues = []string{
	"backend=apiserver", "fencedObjects.enable=true", "namespace.create=false",
	"manager.image.pullPolicy=Never", "apiserver.image.pullPolicy=Never", "etcd.image.pullPolicy=Never",
	"etcd.replicas=1", "etcd.clusterDNS=false", "etcd.persistence.enable=false",
}

// deployChart installs dist/chart with backend=apiserver, as a user of that
// backend would, and returns once kube-apiserver serves the lock API from
// kubelock-apiserver, its rules deny what they must, and the fenced-objects
// webhook answers; it then creates the demo lock.
func (e *env) deployChart(ctx context.Context) error {
	started := time.Now()
	if err := e.writeKubeconfig(); err != nil {
		return err
	}
	args := []string{"upgrade", "--install", "kubelock", filepath.Join(e.root, "dist", "chart"),
		"--kubeconfig", e.o.KubeconfigOut, "--namespace", OperatorNamespace,
		// Helm keeps the release in the namespace, so it must exist first.
		"--create-namespace",
		// install() applied the lock-user and break-glass ClusterRoles.
		"--take-ownership"}
	for _, v := range ChartValues {
		args = append(args, "--set", v)
	}
	helm := exec.CommandContext(ctx, e.helm, args...)
	home := filepath.Join(e.o.Dir, "helm")
	helm.Env = append(os.Environ(), "HELM_CACHE_HOME="+home, "HELM_CONFIG_HOME="+home, "HELM_DATA_HOME="+home)
	if out, err := helm.CombinedOutput(); err != nil {
		return fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, out)
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	for _, d := range []string{APIServerDeployment, OperatorDeployment} {
		if err := e.waitAvailable(ctx, c, d); err != nil {
			return err
		}
	}
	// Served once the APIService is available; until then the create fails.
	var last error
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*e.o.StartTimeout, true, func(ctx context.Context) (bool, error) {
		last = createDemoLock(ctx, c)
		return last == nil, nil
	}); err != nil {
		return fmt.Errorf("the lock API through the APIService v1alpha1.locks.kubelock.io: %w (kubectl get apiservice v1alpha1.locks.kubelock.io; kubectl -n %s logs deploy/%s)", errors.Join(err, last), OperatorNamespace, APIServerDeployment)
	}
	e.progress("the chart with backend=apiserver: kubelock-apiserver, its etcd and the operator serve the lock API after %s; lock default/%s created", time.Since(started).Round(10*time.Millisecond), DemoLock)
	if err := e.waitAdmission(ctx, c, lockAPIServerDenial, "kubelock-apiserver's rules"); err != nil {
		return err
	}
	if err := e.waitFencedWebhook(ctx, c, fmt.Sprintf("Service %s/kubelock-webhook-service", OperatorNamespace)); err != nil {
		return err
	}
	return bindConfigMapWriters(ctx, c)
}
