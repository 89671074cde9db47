package suite

import (
	"context"
	"os"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubelock/kubelock/test/lockapi"
	"github.com/kubelock/kubelock/test/testenv"
)

// LockAPI is kubelock-apiserver built from cmd/kubelock-apiserver, to serve
// the lock API of the suites' aggregated control planes (the apiserver backend).
type LockAPI struct{ bin string }

// BuildLockAPI builds kubelock-apiserver for a container's BeforeAll or a
// spec; DeferCleanup removes the binary.
func BuildLockAPI(ctx context.Context) *LockAPI {
	dir, err := os.MkdirTemp("", "kubelock-apiserver-bin-")
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() { Expect(os.RemoveAll(dir)).To(Succeed()) })
	bin, err := lockapi.Build(ctx, dir)
	Expect(err).NotTo(HaveOccurred())
	return &LockAPI{bin: bin}
}

// Serve runs it with o (and an etcd of its own) for env, a control plane
// lockapi.ControlPlane started, and waits until kube-apiserver serves the
// lock API from it; DeferCleanup stops it and removes its files.
func (a *LockAPI) Serve(ctx context.Context, env *testenv.Env, o lockapi.Options) *lockapi.Server {
	dir, err := os.MkdirTemp("", "kubelock-apiserver-")
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() { Expect(os.RemoveAll(dir)).To(Succeed()) })
	srv, err := lockapi.Start(ctx, env, a.bin, dir, o)
	if srv != nil {
		DeferCleanup(func() { Expect(srv.Stop()).To(Succeed()) })
	}
	Expect(err).NotTo(HaveOccurred())
	Expect(srv.Register(ctx, env)).To(Succeed())
	return srv
}

// StartLockAPI is Start on the apiserver backend: an aggregated control
// plane without the lock CRDs whose lock API api serves, and the
// webhook server of this process for the fenced Kubernetes objects. The lock
// apiserver's controller user is lockapi.ControllerUser.
func StartLockAPI(ctx context.Context, api *LockAPI) (*testenv.Env, *lockapi.Server) {
	env := start(lockapi.ControlPlane, lockapi.ControllerUser, nil)
	// kube-apiserver proxies the lock API without admitting it, so the lock
	// webhooks envtest installed would never be asked; they go, so that
	// nothing but the lock apiserver's own rules can refuse a lock write.
	for _, w := range env.WebhookInstallOptions.ValidatingWebhooks {
		Expect(env.Client.Delete(ctx, w)).To(Succeed())
	}
	return env, api.Serve(ctx, env, lockapi.Options{})
}
