package testenv

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kubelock/kubelock/internal/proc"
)

// PodBoundControllers are the kube-controller-manager controllers pod-bound
// sessions need: the garbage collector deletes what a deleted Pod owned; the
// others give namespaces their cleanup and "default" service account.
// These are the names the health checks carry (the short ones are aliases).
var PodBoundControllers = []string{"garbage-collector-controller", "namespace-controller", "serviceaccount-controller", "serviceaccount-token-controller"}

// ControllerManager is a kube-controller-manager process against an Env.
type ControllerManager struct {
	child *proc.Child
	dir   string
}

// StartControllerManager starts kube-controller-manager from AssetsDir as a
// system:masters user, running controllers (PodBoundControllers when none),
// and returns once each controller's health check answers. Stop it with Stop.
func (e *Env) StartControllerManager(ctx context.Context, controllers ...string) (*ControllerManager, error) {
	if len(controllers) == 0 {
		controllers = PodBoundControllers
	}
	user, err := e.AddUser(envtest.User{Name: "system:kube-controller-manager", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return nil, err
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "kubelock-kcm-")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "kubeconfig"), kubeconfig, 0o600); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	apiserver := e.ControlPlane.GetAPIServer()
	// The key the apiserver signs service-account tokens with (envtest's default file unless a suite set the flag).
	saKey := apiserver.Configure().Get("service-account-signing-key-file").Get([]string{filepath.Join(apiserver.CertDir, "sa-signer.key")})[0]
	c, err := proc.Start("kube-controller-manager", filepath.Join(AssetsDir(), "kube-controller-manager"), filepath.Join(dir, "kube-controller-manager.log"),
		"--kubeconfig="+filepath.Join(dir, "kubeconfig"),
		"--controllers="+strings.Join(controllers, ","),
		"--leader-elect=false",
		"--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(port), "--cert-dir="+dir,
		"--service-account-private-key-file="+saKey,
	)
	if err != nil {
		return nil, err
	}
	m := &ControllerManager{child: c, dir: dir}
	// Self-signed serving certificate; /healthz is all this client reads.
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // a local health probe
	defer hc.CloseIdleConnections()
	url := fmt.Sprintf("https://127.0.0.1:%d/healthz?verbose", port)
	// A controller is listed once it started, so this waits for all of them.
	err = c.WaitFor(ctx, "running "+strings.Join(controllers, ","), time.Minute, func(ctx context.Context) error {
		return listsHealthy(ctx, hc, url, controllers)
	})
	if err == nil && slices.Contains(controllers, "garbage-collector-controller") {
		err = e.waitCollecting(ctx)
	}
	if err != nil {
		_ = c.Stop(10 * time.Second) // the log stays in dir for the error's reader
		return nil, err
	}
	return m, nil
}

// waitCollecting returns once the garbage collector deleted a probe whose owner
// does not exist: it starts collecting only after its monitors synced (~1 s after
// its health check passes), which would otherwise add to a suite's first measurement.
func (e *Env) waitCollecting(ctx context.Context) error {
	probe := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		GenerateName: "gc-probe-", Namespace: metav1.NamespaceDefault,
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "absent", UID: uuid.NewUUID()}},
	}}
	if err := e.Client.Create(ctx, probe); err != nil {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		err := e.Client.Get(ctx, client.ObjectKeyFromObject(probe), probe)
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
}

// Stop stops the process and removes its files.
func (m *ControllerManager) Stop() error {
	err := m.child.Stop(20 * time.Second)
	_ = os.RemoveAll(m.dir)
	return err
}

// listsHealthy reads url (/healthz?verbose) and checks that it lists every one of names as ok.
func listsHealthy(ctx context.Context, hc *http.Client, url string, names []string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if err != nil {
		return err
	}
	for _, name := range names {
		if !strings.Contains(string(body), "[+]"+name+" ok") {
			return fmt.Errorf("%s: %s not ok: %s", url, name, body)
		}
	}
	return nil
}

// freePort is a port nothing listens on now, as envtest picks the apiserver's.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
