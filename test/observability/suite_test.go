// Package observability tests what an operator sees of kubelock — metrics of
// the manager and of the client library, Events, the Held condition with the
// real kubectl, and the apiserver audit log — against a real kube-apiserver
// and etcd, with the admission webhook and the controller running in process.
package observability

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubelock/kubelock/controllers"
	"github.com/kubelock/kubelock/test/suite"
	"github.com/kubelock/kubelock/test/testenv"
)

// grace is the controller's expiry grace: short, so an expiry takes seconds.
const grace = 200 * time.Millisecond

var (
	env *testenv.Env
	// auditLog is the apiserver's audit log, written with config/audit/policy.yaml.
	auditLog string
)

func TestObservability(t *testing.T) {
	suite.Run(t, "observability suite", 20*time.Second, 20*time.Millisecond)
}

var _ = BeforeSuite(func() {
	dir, err := os.MkdirTemp("", "kubelock-audit-")
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(os.RemoveAll, dir)
	auditLog = filepath.Join(dir, "audit.log")
	env = suite.Start(suite.ControllerUser, testenv.WithAPIServerArgs(
		"audit-policy-file", filepath.Join(testenv.RepoRoot(), "config", "audit", "policy.yaml"),
		"audit-log-path", auditLog,
		"audit-log-format", "json",
		"audit-log-mode", "blocking",
	))
	// The controller's metrics go to controller-runtime's registry.
	DeferCleanup(suite.RunController(suite.ControllerUser, controllers.WithExpiryGrace(grace), controllers.WithUsername(suite.ControllerUser)))
})
