// Package integration tests the lock protocol end to end: pkg/lock clients and
// the expiry controller against a real kube-apiserver and etcd, on each backend
// of the lock API (backends_test.go).
package integration

import (
	"testing"
	"time"

	"github.com/kubelock/kubelock/controllers"
	"github.com/kubelock/kubelock/test/suite"
)

var (
	// env is the control plane of the backend whose specs run.
	env *lockEnv
	// stopController stops the in-process controller started by startController.
	stopController func()
)

func TestIntegration(t *testing.T) {
	backends.build()
	suite.Run(t, "lock protocol integration suite", 15*time.Second, 20*time.Millisecond)
}

// startController runs the expiry controller in this process with a short
// grace, as the operator runs it, against the backend's control plane.
func startController() {
	stopController = suite.RunController(controllerUser, controllers.WithExpiryGrace(200*time.Millisecond))
}

func int32p(v int32) *int32 { return &v }
