package v1alpha1_test

import (
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubelock/kubelock/test/testenv"
)

// env is the one control plane of this suite; ns is the namespace its locks live in.
var (
	env *testenv.Env
	ns  string
)

func TestAPI(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "DistributedLock API suite")
}

var _ = BeforeSuite(func(ctx SpecContext) {
	var err error
	env, err = testenv.Start()
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() {
		Expect(env.Stop()).To(Succeed())
	})

	n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "api-"}}
	Expect(env.Client.Create(ctx, n)).To(Succeed())
	ns = n.Name
})
