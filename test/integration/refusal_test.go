package integration

import (
	"net/http"
	"strings"
	"sync"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/suite"
	"github.com/kubelock/kubelock/test/testenv"
)

// requests counts what a client sends: its lock status writes and its /readyz polls.
type requests struct {
	mu            sync.Mutex
	writes, polls int
}

// count makes cfg's clients count their requests in r.
func (r *requests) count(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			r.mu.Lock()
			switch {
			case req.URL.Path == "/readyz":
				r.polls++
			case req.Method == http.MethodPut && strings.HasSuffix(req.URL.Path, "/status"):
				r.writes++
			}
			r.mu.Unlock()
			return rt.RoundTrip(req)
		})
	})
	return cfg
}

func (r *requests) get() (writes, polls int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.writes, r.polls
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A client sends again a request the authorizer refuses while the apiserver is
// not ready (test/e2e/faults restarts one for that); here the apiserver is
// ready, and every refusal must be final after one write.
var _ = Describe("refusals on a ready apiserver", func() {
	var ns string
	suite.NamespaceEach(&ns, "refused")

	It("returns the authorizer's 403 after one write and one /readyz poll", func(ctx SpecContext) {
		cfg, user := suite.UserConfig(ctx)
		var sent requests
		c, err := lock.New(sent.count(cfg), lock.WithNamespace(ns), lock.WithIdentity(user))
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

		writes, polls := sent.get()
		err = held.Release(ctx)
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "release: %v", err)
		w, p := sent.get()
		Expect([]int{w - writes, p - polls}).To(Equal([]int{1, 1}), "status writes and /readyz polls of the release")
	})

	It("returns an admission rule's 403 after one write, without asking /readyz", func(ctx SpecContext) {
		cfg, err := env.ControllerConfig(suite.ControllerUser)
		Expect(err).NotTo(HaveOccurred())
		var sent requests
		c, err := lock.New(sent.count(cfg), lock.WithNamespace(ns), lock.WithIdentity("the-controller"))
		Expect(err).NotTo(HaveOccurred())
		_, err = c.TryAcquire(ctx, "refused")
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "acquire as the controller: %v", err)
		Expect(err.Error()).To(ContainSubstring("[kubelock:controller-only]"))
		w, p := sent.get()
		Expect([]int{w, p}).To(Equal([]int{1, 0}), "status writes and /readyz polls of the acquire")
	})
})
