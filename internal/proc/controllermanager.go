package proc

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Controllers are the kube-controller-manager controllers kubelock needs: the
// garbage collector deletes what a deleted Pod owned (pod-bound sessions); the
// namespace and service-account ones clean up deleted namespaces and give each
// its "default" service account; the resource quota controller computes a
// ResourceQuota's usage, without which the apiserver refuses every create the
// quota covers. These are the names the health checks carry (the short ones are aliases).
var Controllers = []string{"garbage-collector-controller", "namespace-controller", "serviceaccount-controller", "serviceaccount-token-controller", "resourcequota-controller"}

// StartControllerManager starts the kube-controller-manager at path, without
// leader election, connected with kubeconfig (a system:masters user's: the
// garbage collector deletes anything), running Controllers; saKey is
// the apiserver's service-account signing key; extraArgs are added (a
// repeated --controllers adds to the list). It returns once /healthz, on a
// free port of 127.0.0.1, lists each controller as ok.
func StartControllerManager(ctx context.Context, path, logPath, kubeconfig, saKey string, timeout time.Duration, extraArgs ...string) (*Child, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	c, err := Start("kube-controller-manager", path, logPath, append([]string{
		"--kubeconfig=" + kubeconfig,
		"--controllers=" + strings.Join(Controllers, ","),
		"--leader-elect=false",
		"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(port),
		"--service-account-private-key-file=" + saKey,
	}, extraArgs...)...)
	if err != nil {
		return nil, err
	}
	hc := &http.Client{Transport: InsecureTransport()}
	defer hc.CloseIdleConnections()
	url := fmt.Sprintf("https://127.0.0.1:%d/healthz?verbose", port)
	// A controller is listed once it started, so this waits for all of them.
	err = c.WaitFor(ctx, "running its controllers", timeout, func(ctx context.Context) error {
		return listsHealthy(ctx, hc, url, Controllers)
	})
	if err != nil {
		_ = c.Stop(10 * time.Second)
		return nil, err
	}
	return c, nil
}

// listsHealthy reads url (/healthz?verbose) and checks that it lists each of names as ok.
func listsHealthy(ctx context.Context, hc *http.Client, url string, names []string) error {
	body, err := GetOK(ctx, hc, url)
	if err != nil {
		return err
	}
	for _, name := range names {
		if !strings.Contains(body, "[+]"+name+" ok") {
			return fmt.Errorf("%s not ok yet: %s", name, strings.TrimSpace(body))
		}
	}
	return nil
}

// FreePort is a port nothing listens on now (as envtest picks the apiserver's).
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().(*net.TCPAddr).Port, nil //nolint:errcheck // a TCP listener's address
}
