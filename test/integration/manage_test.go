package integration

import (
	"context"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/suite"
)

var _ = backends.Describe("release by lease ID and force-release", func() {
	ctx := context.Background()
	var ns string
	suite.NamespaceEach(&ns, "jobs")

	It("releases a lease from another process of the same user, idempotently", func() {
		cfg, _ := suite.UserConfig(ctx)
		holder, err := lock.New(cfg, lock.WithNamespace(ns), lock.WithIdentity("acquirer"), lock.WithoutAutoRenew())
		Expect(err).NotTo(HaveOccurred())
		later, err := lock.New(cfg, lock.WithNamespace(ns), lock.WithIdentity("releaser"))
		Expect(err).NotTo(HaveOccurred())
		l, err := holder.Acquire(ctx, "jobs")
		Expect(err).NotTo(HaveOccurred())

		Expect(later.ReleaseLease(ctx, "jobs", "0123456789abcdef0123456789abcdef")).To(MatchError(lock.ErrLockLost))
		Expect(suite.GetLock(ctx, ns, "jobs").Status.Holder.LeaseID).To(Equal(l.LeaseID()))
		Expect(later.ReleaseLease(ctx, "jobs", l.LeaseID())).To(Succeed())
		Expect(suite.GetLock(ctx, ns, "jobs").Status.Holder).To(BeNil())
		Expect(later.ReleaseLease(ctx, "jobs", l.LeaseID())).To(Succeed())
	})

	It("lets only a user with the force-release verb break a lock, and the holder learns it lost", func() {
		holder, _ := suite.NewClient(ctx, ns)
		l, err := holder.Acquire(ctx, "jobs")
		Expect(err).NotTo(HaveOccurred())

		plain, _ := suite.NewClient(ctx, ns)
		_, err = plain.ForceRelease(ctx, "jobs", "trying my luck")
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "got %v", err)
		Expect(err.Error()).To(ContainSubstring("[kubelock:force-release]"))
		Expect(suite.GetLock(ctx, ns, "jobs").Status.Holder.LeaseID).To(Equal(l.LeaseID()))

		breaker, breakerName := suite.NewClient(ctx, ns)
		suite.GrantForceRelease(ctx, ns, breakerName)
		all, err := breaker.ForceRelease(ctx, "jobs", "stuck job, ticket 42")
		Expect(err).NotTo(HaveOccurred())
		Expect(all).To(HaveLen(1))
		ended := all[0]
		Expect(ended.LeaseID).To(Equal(l.LeaseID()))
		Expect(ended.EndReason).To(Equal(locksv1alpha1.EndReasonForceReleased))
		Expect(ended.EndedBy).To(Equal(breakerName))
		Expect(ended.Message).To(Equal("stuck job, ticket 42"))

		Expect(l.Renew(ctx)).To(MatchError(lock.ErrLockLost))
		Expect(l.Done()).To(BeClosed())
		Expect(l.Release(ctx)).To(MatchError(lock.ErrLockLost))
	})
})
