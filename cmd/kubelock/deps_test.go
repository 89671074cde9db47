package main

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// operatorCode are the packages (and everything under them) that kubelock,
// which ships in sidecar images, must not link: the operator and the local
// environment (cmd/kubelock-dev) that runs it.
var operatorCode = []string{
	"github.com/kubelock/kubelock/controllers",
	"github.com/kubelock/kubelock/webhook",
	"github.com/kubelock/kubelock/internal/manager",
	"github.com/kubelock/kubelock/internal/devenv",
	"github.com/kubelock/kubelock/config", // the embedded manifests
	"github.com/open-policy-agent/cert-controller",
	"sigs.k8s.io/controller-runtime/pkg/manager",
	"sigs.k8s.io/controller-runtime/pkg/webhook",
}

func TestLinksNoOperatorCode(t *testing.T) {
	// go test puts the go command that runs it first on PATH.
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list -deps: %v: %s", err, ee.Stderr)
		}
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps listed only %q", deps)
	}
	for _, dep := range deps {
		for _, bad := range operatorCode {
			if dep == bad || strings.HasPrefix(dep, bad+"/") {
				t.Errorf("cmd/kubelock depends on %s: the CLI must link no operator code", dep)
			}
		}
	}
	t.Logf("cmd/kubelock has %d dependencies", len(deps))
}
