package testenv

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubelock/kubelock/internal/localcluster"
)

// ControllerManager is a kube-controller-manager process against an Env.
type ControllerManager struct {
	kcm *localcluster.ControllerManager
}

// StartControllerManager starts kube-controller-manager from AssetsDir running
// localcluster.Controllers, and returns once the garbage collector collects.
// Stop it with Stop.
func (e *Env) StartControllerManager(ctx context.Context) (*ControllerManager, error) {
	m := &ControllerManager{kcm: e.Cluster.ControllerManager}
	if err := m.kcm.Start(ctx); err != nil {
		return nil, err // its log stays for the error's reader until Env.Stop
	}
	if err := e.waitCollecting(ctx); err != nil {
		_ = m.Stop()
		return nil, err
	}
	return m, nil
}

// Stop stops the process.
func (m *ControllerManager) Stop() error { return m.kcm.Stop() }

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
