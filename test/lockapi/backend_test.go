package lockapi_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/internal/lockbackend"
	"github.com/kubelock/kubelock/test/lockapi"
	"github.com/kubelock/kubelock/test/testenv"
)

// The refusals' common part: why locks are never carried across.
const notCarried = "each backend's fencing tokens come from its own etcd's revisions, so locks are never carried across"

// On a cluster whose CRDs hold a lock, kubelock-apiserver refuses to start
// (it would serve the group version from an etcd without that lock's token),
// registering it is refused, and its check-backend command refuses too.
func TestLockAPIServerRefusesToStartWhileTheCRDsHoldLocks(t *testing.T) {
	ctx := t.Context()
	crdPlane, err := testenv.StartAggregated()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = crdPlane.Stop() })
	if err := crdPlane.Client.Create(ctx, &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "held"}}); err != nil {
		t.Fatal(err)
	}
	want := "refusing to serve locks.kubelock.io/v1alpha1 from the apiserver backend: the crd backend serves it " +
		"(CRDs distributedlocks.locks.kubelock.io, locksessions.locks.kubelock.io) and holds 1 DistributedLock(s) and 0 LockSession(s); " + notCarried

	dir := t.TempDir()
	srv, err := lockapi.Start(ctx, crdPlane, bin, dir, lockapi.Options{Name: "refused"})
	if srv != nil {
		t.Cleanup(func() { _ = srv.Stop() })
	}
	if err == nil || !strings.Contains(err.Error(), "refused exited") {
		t.Fatalf("the lock apiserver started beside the CRDs: %v", err)
	}
	if log, _ := os.ReadFile(filepath.Join(dir, "refused.log")); !strings.Contains(string(log), want) {
		t.Errorf("its log does not say %q:\n%s", want, log)
	}

	refused := &lockbackend.SwitchRefusedError{}
	if err := lockbackend.Check(ctx, crdPlane.Client, lockbackend.APIServer); !errors.As(err, &refused) || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("Check(apiserver) = %v, want a refusal starting %q", err, want)
	}
	if err := lockbackend.Check(ctx, crdPlane.Client, lockbackend.CRD); err != nil {
		t.Errorf("Check(crd) on the CRD backend = %v, want nil", err)
	}
	checkBackendCommand(t, crdPlane, "apiserver", want)
}

// On a cluster whose lock apiserver holds a lock, installing the CRDs is
// refused (Check, as kubelock-dev runs it, and the check-backend command).
func TestInstallingTheCRDsIsRefusedWhileTheLockAPIServerHoldsLocks(t *testing.T) {
	ctx := t.Context()
	ns := namespace(t)
	if err := env.Client.Create(ctx, &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "held"}}); err != nil {
		t.Fatal(err)
	}
	want := "refusing to serve locks.kubelock.io/v1alpha1 from the crd backend: the apiserver backend serves it " +
		"(APIService v1alpha1.locks.kubelock.io, Service kubelock-system/kubelock-apiserver) and holds "
	refused := &lockbackend.SwitchRefusedError{}
	err := lockbackend.Check(ctx, env.Client, lockbackend.CRD)
	if !errors.As(err, &refused) || !strings.HasPrefix(err.Error(), want) || refused.Locks < 1 || refused.CountErr != nil {
		t.Fatalf("Check(crd) = %v, want a refusal counting the lock, starting %q", err, want)
	}
	if !strings.Contains(err.Error(), notCarried) || !strings.HasSuffix(err.Error(), "then remove it (kubectl delete apiservice v1alpha1.locks.kubelock.io) and switch") {
		t.Errorf("the refusal does not say why and what to do: %v", err)
	}
	if err := lockbackend.Check(ctx, env.Client, lockbackend.APIServer); err != nil {
		t.Errorf("Check(apiserver) on the apiserver backend = %v, want nil", err)
	}
	checkBackendCommand(t, env, "crd", want)
}

// checkBackendCommand runs `kubelock-apiserver check-backend to` against
// e as its administrator and wants it to fail with a message containing want.
func checkBackendCommand(t *testing.T, e *testenv.Env, to, want string) {
	t.Helper()
	kubeconfig, err := e.Cluster.Kubeconfig("check-backend.kubeconfig", "check-backend", "system:masters")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(t.Context(), bin, "check-backend", to, "--kubeconfig", kubeconfig).CombinedOutput()
	if ee := (&exec.ExitError{}); !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), want) {
		t.Errorf("check-backend %s: %v, %s; want exit 1 saying %q", to, err, out, want)
	}
}
