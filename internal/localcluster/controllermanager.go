package localcluster

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/kubelock/kubelock/internal/proc"
)

// Controllers are the kube-controller-manager controllers kubelock needs: the
// garbage collector deletes what a deleted Pod owned (pod-bound sessions); the
// namespace and service-account ones clean up deleted namespaces and give each
// its "default" service account; the resource quota controller computes a
// ResourceQuota's usage, without which the apiserver refuses every create the
// quota covers. These are the names the health checks carry (the short ones are aliases).
var Controllers = []string{"garbage-collector-controller", "namespace-controller", "serviceaccount-controller", "serviceaccount-token-controller", "resourcequota-controller"}

// ControllerManager is kube-controller-manager, without leader election,
// running Controllers (every controller when the cluster has a node).
type ControllerManager struct {
	*Component
}

// newControllerManager lays it out: connected to host as
// system:kube-controller-manager in system:masters (the garbage collector
// deletes anything), signing with the service accounts' key, ready once
// /healthz, on a free port of 127.0.0.1, lists each of Controllers as ok.
func newControllerManager(o *Options, auth *authority, host, saKey string) (*ControllerManager, error) {
	kubeconfig, err := auth.kubeconfig(host, "kube-controller-manager.kubeconfig", "system:kube-controller-manager", "system:masters")
	if err != nil {
		return nil, err
	}
	port, err := proc.FreePort()
	if err != nil {
		return nil, err
	}
	f := []string{
		"--kubeconfig=" + kubeconfig,
		"--controllers=" + strings.Join(Controllers, ","),
		"--leader-elect=false",
		"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(port),
		"--service-account-private-key-file=" + saKey,
	}
	if o.NodeIP != "" {
		// Deployments, ReplicaSets, Jobs, EndpointSlices, node lifecycle...; pods
		// get the CA in their service-account volume.
		f = append(f, "--controllers=*", "--root-ca-file="+auth.caFile())
	}
	url := fmt.Sprintf("https://127.0.0.1:%d/healthz?verbose", port)
	return &ControllerManager{&Component{
		Name: "kube-controller-manager", Path: filepath.Join(o.AssetsDir, "kube-controller-manager"),
		Args: withFlags(f, o.ControllerManagerArgs), LogPath: filepath.Join(o.LogDir, "kube-controller-manager.log"),
		// A controller is listed once it started, so this waits for all of them.
		Ready: func(ctx context.Context) error {
			hc := &http.Client{Transport: proc.InsecureTransport()}
			defer hc.CloseIdleConnections()
			return listsHealthy(ctx, hc, url, Controllers)
		},
		Readiness: "running its controllers", StartTimeout: o.StartTimeout,
	}}, nil
}

// listsHealthy reads url (/healthz?verbose) and checks that it lists each of names as ok.
func listsHealthy(ctx context.Context, hc *http.Client, url string, names []string) error {
	body, err := proc.GetOK(ctx, hc, url)
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
