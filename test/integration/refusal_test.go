package integration

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/suite"
	"github.com/kubelock/kubelock/test/testenv"
)

// A client sends again a request a starting apiserver refuses while it is
// not ready (test/e2e/faults restarts one for that); here the apiserver is
// ready, and every refusal must be final after one write.
var _ = backends.Describe("refusals on a ready apiserver", func() {
	var ns string
	suite.NamespaceEach(&ns, "refused")

	It("returns the authorizer's 403 after one write and one /readyz poll", func(ctx SpecContext) {
		cfg, user := suite.UserConfig(ctx)
		var sent suite.Requests
		c, err := lock.New(sent.Count(cfg), lock.WithNamespace(ns), lock.WithIdentity(user))
		Expect(err).NotTo(HaveOccurred())
		held, err := c.TryAcquire(ctx, "refused")
		Expect(err).NotTo(HaveOccurred())

		By("taking the user's RBAC away")
		binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: testenv.LockUserRole + "-" + user}}
		Expect(env.Client.Delete(ctx, binding)).To(Succeed())
		Eventually(func(g Gomega) {
			review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: user,
				ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: "update", Group: locksv1alpha1.GroupVersion.Group, Resource: "distributedlocks", Subresource: "status"}}}
			g.Expect(env.Client.Create(ctx, review)).To(Succeed())
			g.Expect(review.Status.Allowed).To(BeFalse())
		}).Should(Succeed())

		before := sent.Get()
		err = held.Release(ctx)
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "release: %v", err)
		Expect(sent.Since(before)).To(Equal(suite.Sent{Writes: 1, Refused: 1, Polls: 1}), "what the release sent")
	})

	It("returns an admission rule's 403 after one write, without asking /readyz", func(ctx SpecContext) {
		cfg, err := env.ControllerConfig(controllerUser)
		Expect(err).NotTo(HaveOccurred())
		var sent suite.Requests
		c, err := lock.New(sent.Count(cfg), lock.WithNamespace(ns), lock.WithIdentity("the-controller"))
		Expect(err).NotTo(HaveOccurred())
		_, err = c.TryAcquire(ctx, "refused")
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "acquire as the controller: %v", err)
		Expect(err.Error()).To(ContainSubstring("[kubelock:controller-only]"))
		Expect(sent.Get()).To(Equal(suite.Sent{Writes: 1, Refused: 1}), "what the acquire sent")
	})
})
