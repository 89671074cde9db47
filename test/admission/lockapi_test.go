package admission

import (
	"context"
	"encoding/json"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/lockapiserver/lockrules"
	"github.com/kubelock/kubelock/test/lockapi"
	"github.com/kubelock/kubelock/test/suite"
)

// lockServer is the running kubelock-apiserver while its container runs.
var lockServer *lockapi.Server

// The third engine: kubelock-apiserver, which serves the lock API from its
// own etcd and runs the rules in its registry strategies. A group version is
// served by a CRD or by an APIService, never both, so it serves a control
// plane of its own (aggregated, without the lock CRDs). While this container
// runs (Ginkgo runs an Ordered container's specs together, one at a time),
// the suite's control plane and users are that control plane's, and the
// same tables run against it.
var _ = Describe("admission by the lock apiserver", Ordered, ContinueOnFailure, func() {
	BeforeAll(func(ctx SpecContext) {
		DeferCleanup(keepWorld())
		cp, err := lockapi.ControlPlane()
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(cp.Stop()).To(Succeed()) })
		Expect(lockapi.ControllerUser).To(Equal(controllerUser))
		env, lockServer = cp, suite.BuildLockAPI(ctx).Serve(ctx, cp, lockapi.Options{})
		setUpUsers(ctx)
	})

	statusSpecs(engineLockAPI)
	metaSpecs(engineLockAPI)
	Context("sessions", func() {
		BeforeAll(sessionUsers)
		sessionSpecs(engineLockAPI)
		redteamSessionSpecs(engineLockAPI)
	})
	redteamSpecs(engineLockAPI)
	redteam3Specs(engineLockAPI)
	Context("with the garbage collector", func() { sessionGCSpecs(engineLockAPI) })
})

// keepWorld returns what puts the suite's control plane and users back.
func keepWorld() func() {
	e, r := env, raw
	users := []*user{alice, bob, carol, dave, ctlr, breakglass, deleter, podUser, mallory, lockadmin, operator, eve, gc}
	pods := []func() *user{otherPodUser, badPodUser, unboundPodUser}
	return func() {
		env, raw, lockServer = e, r, nil
		alice, bob, carol, dave, ctlr, breakglass, deleter, podUser, mallory, lockadmin, operator, eve, gc =
			users[0], users[1], users[2], users[3], users[4], users[5], users[6], users[7], users[8], users[9], users[10], users[11], users[12]
		otherPodUser, badPodUser, unboundPodUser = pods[0], pods[1], pods[2]
	}
}

// unchecked lets writes past every rule, as admin: on the CRD control plane
// with no admission engine (then e again), on the lock apiserver as a
// rewrite of the stored status in its etcd (its rules cannot be turned off).
func unchecked(ctx SpecContext, e engine, admin *user, writes func(write func(client.ObjectKey, func(*locksv1alpha1.DistributedLock)) error)) {
	if e == engineLockAPI {
		writes(func(key client.ObjectKey, fn func(*locksv1alpha1.DistributedLock)) error {
			return rewriteStatus(ctx, key, fn)
		})
		return
	}
	restored := false
	DeferCleanup(func(ctx SpecContext) {
		if !restored {
			activate(ctx, e)
		}
	})
	activate(ctx, engineNone)
	writes(func(key client.ObjectKey, fn func(*locksv1alpha1.DistributedLock)) error {
		return write(ctx, admin, key, fn)
	})
	activate(ctx, e)
	restored = true
}

// rewriteStatus changes the lock's status with fn in the lock store's etcd,
// and waits until the lock apiserver serves the change.
func rewriteStatus(ctx SpecContext, key client.ObjectKey, fn func(*locksv1alpha1.DistributedLock)) error {
	l := get(ctx, key)
	fn(l)
	b, err := json.Marshal(l.Status)
	if err != nil {
		return err
	}
	var status map[string]any
	if err := json.Unmarshal(b, &status); err != nil {
		return err
	}
	err = rewriteStored(ctx, key, func(obj map[string]any) { obj["status"] = status })
	if err != nil {
		return err
	}
	Eventually(func() string { return get(ctx, key).ResourceVersion }).ShouldNot(Equal(l.ResourceVersion))
	return nil
}

// rewriteStored changes the lock stored at key in the etcd of the engine
// under test: the lock apiserver's while its container runs, else the
// suite's control plane's.
func rewriteStored(ctx context.Context, key client.ObjectKey, change func(obj map[string]any)) error {
	if lockServer != nil {
		return lockServer.RewriteStored(ctx, lockrules.Locks, key, change)
	}
	return env.RewriteStored(ctx, lockrules.Locks, key, change)
}
