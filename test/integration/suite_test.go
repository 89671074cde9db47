// Package integration tests the lock protocol end to end: pkg/lock clients and
// the expiry controller against a real kube-apiserver and etcd.
package integration

import (
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"

	"github.com/kubelock/kubelock/controllers"
	"github.com/kubelock/kubelock/test/suite"
	"github.com/kubelock/kubelock/test/testenv"
)

var (
	env *testenv.Env
	// stopController stops the in-process controller started by startController.
	stopController func()
)

func TestIntegration(t *testing.T) {
	suite.Run(t, "lock protocol integration suite", 15*time.Second, 20*time.Millisecond)
}

var _ = BeforeSuite(func() {
	// Every spec runs with the admission webhook in front of the locks, so the
	// client library is proven against the server-side rules too.
	env = suite.Start(suite.ControllerUser)
	startController()
})

var _ = AfterSuite(func() {
	if stopController != nil {
		stopController()
	}
})

// startController runs the expiry controller in this process with a short
// grace, as the operator runs it, against the shared control plane.
func startController() {
	stopController = suite.RunController(suite.ControllerUser, controllers.WithExpiryGrace(200*time.Millisecond))
}

func int32p(v int32) *int32 { return &v }
