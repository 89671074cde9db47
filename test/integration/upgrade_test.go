package integration

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/types"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/suite"
)

// Locks an earlier release stored, read by this one. The controller stops for
// the spec: it repairs a lock's counts in its next write, and the holder's own
// writes must not depend on it.
var _ = backends.Describe("a lock stored before holderCount existed", Serial, func() {
	It("is renewed and released by its holder, whose writes set the count", func(ctx SpecContext) {
		ns := suite.Namespace(ctx)
		suite.NewLock(ctx, ns, "stored-early", locksv1alpha1.DistributedLockSpec{})
		c, _ := suite.NewClient(ctx, ns, lock.WithoutAutoRenew())
		held, err := c.Acquire(ctx, "stored-early")
		Expect(err).NotTo(HaveOccurred())

		stopController()
		DeferCleanup(startController)
		gr := locksv1alpha1.GroupVersion.WithResource("distributedlocks").GroupResource()
		Expect(env.RewriteStored(ctx, gr, types.NamespacedName{Namespace: ns, Name: "stored-early"}, func(obj map[string]any) {
			status, ok := obj["status"].(map[string]any)
			Expect(ok).To(BeTrue())
			delete(status, "holderCount")
		})).To(Succeed())
		stored := suite.GetLock(ctx, ns, "stored-early")
		Expect(stored.Status.Holder).NotTo(BeNil())
		Expect(stored.Status.HolderCount).To(BeZero(), "the lock as the earlier release left it")

		Expect(held.Renew(ctx)).To(Succeed())
		Expect(suite.GetLock(ctx, ns, "stored-early").Status.HolderCount).To(Equal(int32(1)))
		Expect(held.Release(ctx)).To(Succeed())
		after := suite.GetLock(ctx, ns, "stored-early")
		Expect(after.Status.Holder).To(BeNil())
		Expect(after.Status.HolderCount).To(BeZero())
	})
})
