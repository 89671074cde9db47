// Package agent drives `kubelock agent` as a process against a real
// kube-apiserver and etcd (the admission webhook and the expiry controller
// in this process): through its own HTTP API, through Dapr's official
// JavaScript SDK (installed with npm from a pinned lockfile) and through the
// Python example in docs/examples. node, npm and python3 are required: a
// spec without them fails and says so, it is never skipped.
package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/gexec"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/controllers"
	"github.com/kubelock/kubelock/test/suite"
	"github.com/kubelock/kubelock/test/testenv"
)

var (
	env      *testenv.Env
	kubelock string // the built binary
	workDir  string // kubeconfigs
	breakers atomic.Int64
)

func TestAgent(t *testing.T) {
	suite.Run(t, "kubelock agent end-to-end suite", 30*time.Second, 25*time.Millisecond)
}

var _ = BeforeSuite(func() {
	workDir = GinkgoT().TempDir()
	kubelock = filepath.Join(GinkgoT().TempDir(), "kubelock")
	build := exec.Command("go", "build", "-o", kubelock, "./cmd/kubelock")
	build.Dir = testenv.RepoRoot()
	out, err := build.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "go build ./cmd/kubelock: %s", out)

	env = suite.Start(suite.ControllerUser)
	DeferCleanup(suite.RunController(suite.ControllerUser, controllers.WithExpiryGrace(200*time.Millisecond)))
})

// kubeconfig writes cfg as user's kubeconfig and returns its path.
func kubeconfig(user string, cfg *rest.Config) string {
	path := filepath.Join(workDir, user+".kubeconfig")
	suite.WriteKubeconfig(path, user, cfg)
	return path
}

// agentProc is a running `kubelock agent`.
type agentProc struct {
	s    *gexec.Session
	url  string // http://127.0.0.1:PORT
	user string
	ns   string
}

var servingRE = regexp.MustCompile(`serving on (http://\S+)`)

// startAgent runs `kubelock agent` as a fresh lock user in ns, on a free
// port, with a session TTL of 5s (the shortest: losses show within ~2s), and
// returns once it is ready.
func startAgent(ctx context.Context, ns string, args ...string) *agentProc {
	cfg, user := suite.UserConfig(ctx)
	return startAgentAs(user, kubeconfig(user, cfg), ns, args...)
}

func startAgentAs(user, kc, ns string, args ...string) *agentProc {
	cmd := exec.Command(kubelock, append([]string{"--kubeconfig", kc, "-n", ns, "--identity", user,
		"agent", "--listen", "127.0.0.1:0", "--session-ttl", "5s"}, args...)...)
	s, err := gexec.Start(cmd, GinkgoWriter, GinkgoWriter)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() { s.Kill().Wait() })
	a := &agentProc{s: s, user: user, ns: ns}
	Eventually(func() string {
		if m := servingRE.FindSubmatch(s.Err.Contents()); m != nil {
			a.url = string(m[1])
		}
		return a.url
	}).ShouldNot(BeEmpty())
	Eventually(func() int { code, _ := a.raw(http.MethodGet, "/readyz", ""); return code }).Should(Equal(http.StatusOK))
	return a
}

// raw sends one request to the agent and returns the status and body.
func (a *agentProc) raw(method, path, body string) (int, string) {
	req, err := http.NewRequest(method, a.url+path, strings.NewReader(body)) //nolint:noctx // a local test endpoint
	Expect(err).NotTo(HaveOccurred())
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	Expect(err).NotTo(HaveOccurred())
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	Expect(err).NotTo(HaveOccurred())
	return resp.StatusCode, string(b)
}

// call sends one request and decodes the JSON answer.
func (a *agentProc) call(method, path string) (int, answer) {
	code, body := a.raw(method, path, "")
	var ans answer
	Expect(json.Unmarshal([]byte(body), &ans)).To(Succeed(), "%s %s answered %d %q", method, path, code, body)
	return code, ans
}

// answer is the agent's JSON: a holding, or an error.
type answer struct {
	Key          string    `json:"key"`
	Lock         string    `json:"lock"`
	LeaseID      string    `json:"leaseID"`
	FencingToken int64     `json:"fencingToken"`
	Slot         *int32    `json:"slot"`
	Held         bool      `json:"held"`
	LeaseSeconds int64     `json:"leaseSeconds"`
	ExpiresAt    time.Time `json:"expiresAt"`
	Session      string    `json:"session"`
	Ended        string    `json:"ended"`
	Error        string    `json:"error"`
	Reason       string    `json:"reason"`
}

// forceRelease ends key's holding with the CLI, as a user with the
// force-release verb in ns.
func forceRelease(ctx context.Context, ns, key string) {
	cfg, user := suite.UserConfig(ctx)
	suite.GrantForceRelease(ctx, ns, user)
	cmd := exec.Command(kubelock, "--kubeconfig", kubeconfig(user, cfg), "-n", ns, "force-release", key,
		"--reason", fmt.Sprintf("e2e-%d", breakers.Add(1)))
	out, err := cmd.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "force-release %s: %s", key, out)
}

// lockNamed reads the lock object of a holding's "lock" (namespace/name).
func lockNamed(ctx context.Context, nsName string) *locksv1alpha1.DistributedLock {
	ns, name, _ := strings.Cut(nsName, "/")
	return suite.GetLock(ctx, ns, name)
}

// dumpOnFailure prints the agent's log and the namespace's locks and
// sessions when the spec failed.
func dumpOnFailure(ctx context.Context, ns string) {
	DeferCleanup(func() {
		if !CurrentSpecReport().Failed() {
			return
		}
		locks := &locksv1alpha1.DistributedLockList{}
		if err := env.Client.List(ctx, locks, client.InNamespace(ns)); err == nil {
			for _, l := range locks.Items {
				GinkgoWriter.Printf("lock %s at failure: %+v\n", l.Name, l.Status)
			}
		}
		events := &corev1.EventList{}
		if err := env.Client.List(ctx, events, client.InNamespace(ns)); err == nil {
			for _, e := range events.Items {
				GinkgoWriter.Printf("event %s %s: %s\n", e.Reason, e.InvolvedObject.Name, e.Message)
			}
		}
	})
}

// requireTool fails the spec, saying what to install, when name is not on PATH.
func requireTool(name, why string) string {
	path, err := exec.LookPath(name)
	if err != nil {
		Fail(fmt.Sprintf("%s is required (%s) and is not on PATH: install it (Debian: apt-get install %s); this spec is not skipped", name, why, debianPackage(name)))
	}
	return path
}

func debianPackage(tool string) string {
	switch tool {
	case "node":
		return "nodejs"
	case "python3":
		return "python3"
	}
	return tool
}

// repoFile is a path in the checkout.
func repoFile(parts ...string) string {
	return filepath.Join(append([]string{testenv.RepoRoot()}, parts...)...)
}
