package testenv

import (
	"context"
	"os"
	"path/filepath"
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

// ControllerManager is a kube-controller-manager process against an Env.
type ControllerManager struct {
	child *proc.Child
	dir   string
}

// StartControllerManager starts kube-controller-manager from AssetsDir running
// proc.Controllers, and returns once the garbage collector collects.
// Stop it with Stop.
func (e *Env) StartControllerManager(ctx context.Context) (*ControllerManager, error) {
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
	apiserver := e.ControlPlane.GetAPIServer()
	// envtest's default file unless a suite set the flag.
	saKey := apiserver.Configure().Get("service-account-signing-key-file").Get([]string{filepath.Join(apiserver.CertDir, "sa-signer.key")})[0]
	c, err := proc.StartControllerManager(ctx, filepath.Join(AssetsDir(), "kube-controller-manager"),
		filepath.Join(dir, "kube-controller-manager.log"), filepath.Join(dir, "kubeconfig"), saKey, time.Minute)
	if err != nil {
		return nil, err // its log stays in dir for the error's reader
	}
	m := &ControllerManager{child: c, dir: dir}
	if err := e.waitCollecting(ctx); err != nil {
		_ = m.Stop()
		return nil, err
	}
	return m, nil
}

// Stop stops the process and removes its files.
func (m *ControllerManager) Stop() error {
	err := m.child.Stop(20 * time.Second)
	_ = os.RemoveAll(m.dir)
	return err
}

// waitCollecting returns once the garbage collector deleted a probe whose owner
// does not exist: it collects only after its monitors synced (~1 s after its
// health check passes), which would otherwise add to a suite's first measurement.
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
