package integration

import (
	"context"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
)

var _ = Describe("release by lease ID and force-release", func() {
	var (
		ctx context.Context
		ns  string
	)
	BeforeEach(func() {
		ctx = context.Background()
		ns = newNamespace(ctx)
		newLock(ctx, ns, "jobs", locksv1alpha1.DistributedLockSpec{})
	})

	It("releases a lease from another process of the same user, idempotently", func() {
		cfg, _ := userConfig(ctx)
		holder, err := lock.New(cfg, lock.WithNamespace(ns), lock.WithIdentity("acquirer"), lock.WithoutAutoRenew())
		Expect(err).NotTo(HaveOccurred())
		later, err := lock.New(cfg, lock.WithNamespace(ns), lock.WithIdentity("releaser"))
		Expect(err).NotTo(HaveOccurred())
		l, err := holder.Acquire(ctx, "jobs")
		Expect(err).NotTo(HaveOccurred())

		Expect(later.ReleaseLease(ctx, "jobs", "0123456789abcdef0123456789abcdef")).To(MatchError(lock.ErrLockLost))
		Expect(getLock(ctx, ns, "jobs").Status.Holder.LeaseID).To(Equal(l.LeaseID()))
		Expect(later.ReleaseLease(ctx, "jobs", l.LeaseID())).To(Succeed())
		Expect(getLock(ctx, ns, "jobs").Status.Holder).To(BeNil())
		Expect(later.ReleaseLease(ctx, "jobs", l.LeaseID())).To(Succeed())
	})

	It("lets only a user with the force-release verb break a lock, and the holder learns it lost", func() {
		holder, _ := newClient(ctx, ns)
		l, err := holder.Acquire(ctx, "jobs")
		Expect(err).NotTo(HaveOccurred())

		plain, _ := newClient(ctx, ns)
		_, err = plain.ForceRelease(ctx, "jobs", "trying my luck")
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "got %v", err)
		Expect(err.Error()).To(ContainSubstring("[kubelock:force-release]"))
		Expect(getLock(ctx, ns, "jobs").Status.Holder.LeaseID).To(Equal(l.LeaseID()))

		breaker, breakerName := newClient(ctx, ns)
		grantForceRelease(ctx, ns, breakerName)
		ended, err := breaker.ForceRelease(ctx, "jobs", "stuck job, ticket 42")
		Expect(err).NotTo(HaveOccurred())
		Expect(ended.LeaseID).To(Equal(l.LeaseID()))
		Expect(ended.EndReason).To(Equal(locksv1alpha1.EndReasonForceReleased))
		Expect(ended.EndedBy).To(Equal(breakerName))
		Expect(ended.Message).To(Equal("stuck job, ticket 42"))

		Expect(l.Renew(ctx)).To(MatchError(lock.ErrLockLost))
		Expect(l.Done()).To(BeClosed())
		Expect(l.Release(ctx)).To(MatchError(lock.ErrLockLost))
	})
})

// grantForceRelease gives user the force-release verb on locks in ns.
func grantForceRelease(ctx context.Context, ns, user string) {
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "breakglass-" + user},
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{locksv1alpha1.GroupVersion.Group},
			Resources: []string{"distributedlocks"},
			Verbs:     []string{locksv1alpha1.ForceReleaseVerb},
		}},
	}
	Expect(env.Client.Create(ctx, role)).To(Succeed())
	Expect(env.Client.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	})).To(Succeed())
}
