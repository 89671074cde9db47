package devenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/kubelock/kubelock/internal/locallockapi"
	"github.com/kubelock/kubelock/internal/lockbackend"
)

// The backends kubelock-dev runs, as the chart's backend.
const (
	BackendCRD       = string(lockbackend.CRD)
	BackendAPIServer = string(lockbackend.APIServer)
)

// checkBackend fails on a backend kubelock-dev does not know or cannot run
// with the other options.
func checkBackend(backend string, onNode bool, admission string) error {
	switch {
	case backend != BackendCRD && backend != BackendAPIServer:
		return fmt.Errorf("--backend must be %q or %q, got %q", BackendCRD, BackendAPIServer, backend)
	case backend == BackendAPIServer && admission != AdmissionWebhook:
		return fmt.Errorf("--admission %s chooses the CRD backend's engine: kubelock-apiserver runs the rules itself", admission)
	}
	return nil
}

// findLockAPIServer finds kubelock-apiserver, and checks that kube-apiserver
// can reach it, for the apiserver backend as processes.
func (e *env) findLockAPIServer(self string) error {
	if e.o.Backend != BackendAPIServer || e.o.Node {
		return nil
	}
	if _, err := locallockapi.HostIP(); err != nil {
		return fmt.Errorf("--backend %s: %w", e.o.Backend, err)
	}
	var err error
	e.lockAPIBinary, err = findProgram(self, "kubelock-apiserver", "--backend apiserver runs it")
	return err
}

// refuseSwitch fails while the cluster serves the lock API from the other
// backend (a --persist run's data from the other one): switching while it
// holds locks could let a fencing token go down.
func (e *env) refuseSwitch(ctx context.Context) error {
	c, err := e.client()
	if err != nil {
		return err
	}
	return lockbackend.Check(ctx, c, lockbackend.Backend(e.o.Backend))
}

// startLockAPI starts kubelock-apiserver and its etcd, with their data in
// Dir/lockapi and their logs with the others, and registers its APIService.
func (e *env) startLockAPI(ctx context.Context) (*locallockapi.Server, error) {
	o := &e.o
	dir := filepath.Join(o.Dir, "lockapi")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	s, err := locallockapi.Start(ctx, e.cluster, locallockapi.Options{Binary: e.lockAPIBinary, Dir: dir, LogDir: e.logDir,
		AssetsDir: o.AssetsDir, Persist: o.Persist, ControllerUsers: []string{ControllerUser}, StartTimeout: o.StartTimeout})
	if err != nil {
		return s, err
	}
	e.progress("kubelock-apiserver up on %s (its etcd on %s)", s.URL(), strings.Join(s.Etcd.Endpoints(), ", "))
	if err := s.Register(ctx); err != nil {
		return s, err
	}
	e.progress("APIService %s serves the lock API from kubelock-apiserver (Service %s/%s)", locallockapi.APIServiceName, locallockapi.Namespace, s.Name)
	return s, nil
}
