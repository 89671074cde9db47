package main

import (
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// operatorCode are the packages (and everything under them) that kubelock,
// which ships in sidecar images, must not link: the operator, the local
// environment (cmd/kubelock-dev) that runs it and the cluster it starts.
var operatorCode = []string{
	"github.com/kubelock/kubelock/controllers",
	"github.com/kubelock/kubelock/webhook",
	"github.com/kubelock/kubelock/cmd/manager/operator",
	"github.com/kubelock/kubelock/cmd/kubelock-dev/devenv",
	"github.com/kubelock/kubelock/internal/localcluster",
	"github.com/kubelock/kubelock/config", // the embedded manifests
	"github.com/open-policy-agent/cert-controller",
	"sigs.k8s.io/controller-runtime/pkg/manager",
	"sigs.k8s.io/controller-runtime/pkg/webhook",
}

// heavyDeps are what users of the lock client and of HTTP fencing must not
// link: the benchmark's plotting, Redis and etcd clients, pgx (which only
// pkg/fencing/postgres needs) and the image library (only kubelock-dev --node).
var heavyDeps = []string{
	"gonum.org/v1",
	"github.com/go-redsync/redsync",
	"github.com/redis/go-redis",
	"go.etcd.io/etcd/client",
	"github.com/google/pprof",
	"github.com/jackc/pgx",
	"github.com/google/go-containerregistry",
}

// serverCode is what the admission rules must not link: they are pure
// functions that the webhook and any other server of locks call.
var serverCode = []string{
	"github.com/kubelock/kubelock/webhook",
	"github.com/kubelock/kubelock/controllers",
	"github.com/kubelock/kubelock/cmd/manager/operator",
	"k8s.io/api/admission",
	"k8s.io/apiserver",
	"k8s.io/client-go",
	"sigs.k8s.io/controller-runtime",
}

// rulesImports are the only imports of the admission rules besides the
// standard library (depguard says the same to the linter).
var rulesImports = []string{
	"github.com/kubelock/kubelock/api",
	"github.com/kubelock/kubelock/internal/escape",
	"k8s.io/apimachinery",
}

func TestLinksNoOperatorCode(t *testing.T) {
	deps := goListDeps(t, ".")
	checkDeps(t, "cmd/kubelock", deps, operatorCode)
	checkDeps(t, "cmd/kubelock", deps, heavyDeps)
	t.Logf("cmd/kubelock has %d dependencies", len(deps))
}

func TestLibrariesLinkNoHeavyDependencies(t *testing.T) {
	for _, pkg := range []string{"pkg/lock", "pkg/fencing"} {
		checkDeps(t, pkg, goListDeps(t, "../../"+pkg), heavyDeps)
	}
}

func TestRulesImportOnlyTheAPIAndApimachinery(t *testing.T) {
	checkDeps(t, "rules", goListDeps(t, "../../rules"), serverCode)
	out, err := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, "../../rules").Output()
	if err != nil {
		t.Fatalf("go list ../../rules: %v", err)
	}
	imports := strings.Fields(string(out))
	if len(imports) < 5 {
		t.Fatalf("go list ../../rules listed only the imports %q", imports)
	}
	for _, imp := range imports {
		std := !strings.Contains(strings.Split(imp, "/")[0], ".")
		if !std && !slices.ContainsFunc(rulesImports, func(p string) bool { return imp == p || strings.HasPrefix(imp, p+"/") }) {
			t.Errorf("rules imports %s; it may import only the standard library and %v", imp, rulesImports)
		}
	}
}

func goListDeps(t *testing.T, pkg string) []string {
	t.Helper()
	// go test puts the go command that runs it first on PATH.
	out, err := exec.Command("go", "list", "-deps", pkg).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list -deps %s: %v: %s", pkg, err, ee.Stderr)
		}
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps %s listed only %q", pkg, deps)
	}
	return deps
}

func checkDeps(t *testing.T, pkg string, deps, forbidden []string) {
	t.Helper()
	for _, dep := range deps {
		for _, bad := range forbidden {
			if dep == bad || strings.HasPrefix(dep, bad+"/") {
				t.Errorf("%s depends on %s, which it must not link", pkg, dep)
			}
		}
	}
}
