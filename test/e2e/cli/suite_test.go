// Package cli drives the built kubelock binary as a process against a real
// kube-apiserver and etcd, with the admission webhook and the expiry
// controller running in this process.
package cli

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
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
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/controllers"
	"github.com/kubelock/kubelock/test/suite"
	"github.com/kubelock/kubelock/test/testenv"
)

var (
	env *testenv.Env
	// binDir holds the built kubelock and its kubectl-lock symlink.
	binDir   string
	kubelock string
	// workDir holds kubeconfigs and the files the wrapped commands write.
	workDir     string
	nobodyCount atomic.Int64
)

func TestCLI(t *testing.T) {
	suite.Run(t, "kubelock CLI end-to-end suite", 30*time.Second, 25*time.Millisecond)
}

var _ = BeforeSuite(func() {
	binDir = GinkgoT().TempDir()
	workDir = GinkgoT().TempDir()
	kubelock = filepath.Join(binDir, "kubelock")
	build := exec.Command("go", "build", "-o", kubelock, "./cmd/kubelock")
	build.Dir = testenv.RepoRoot()
	out, err := build.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "go build ./cmd/kubelock: %s", out)
	Expect(os.Symlink(kubelock, filepath.Join(binDir, "kubectl-lock"))).To(Succeed())

	env = suite.Start(suite.ControllerUser)
	// Cleanups run last-in first-out: the controller stops before the webhook and the control plane.
	DeferCleanup(suite.RunController(suite.ControllerUser, controllers.WithExpiryGrace(200*time.Millisecond)))
})

// user is an authenticated user with a kubeconfig file of its own.
type user struct {
	name       string
	kubeconfig string
}

// lockUser is a fresh user bound to the lock-user ClusterRole.
func lockUser(ctx context.Context) user {
	cfg, name := suite.UserConfig(ctx)
	return user{name: name, kubeconfig: writeKubeconfig(name, cfg)}
}

// admin is the suite's administrator (system:masters): it may declare locks
// with any spec and read events.
func admin() user { return user{name: "admin", kubeconfig: writeKubeconfig("admin", env.Config)} }

// nobody is a fresh authenticated user without any role.
func nobody() user {
	name := fmt.Sprintf("nobody-%d", nobodyCount.Add(1))
	u, err := env.AddUser(envtest.User{Name: name}, nil)
	Expect(err).NotTo(HaveOccurred())
	return user{name: name, kubeconfig: writeKubeconfig(name, u.Config())}
}

// breakglass is a lock user that may also force-release locks in ns.
func breakglass(ctx context.Context, ns string) user {
	u := lockUser(ctx)
	suite.GrantForceRelease(ctx, ns, u.name)
	return u
}

// writeKubeconfig writes cfg as name's kubeconfig file in workDir.
func writeKubeconfig(name string, cfg *rest.Config) string {
	path := filepath.Join(workDir, name+".kubeconfig")
	suite.WriteKubeconfig(path, name, cfg)
	return path
}

// unreachableKubeconfig points at a local port nothing listens on.
func unreachableKubeconfig() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	addr := ln.Addr().String()
	Expect(ln.Close()).To(Succeed())
	return writeKubeconfig("unreachable", &rest.Config{Host: "https://" + addr, TLSClientConfig: rest.TLSClientConfig{Insecure: true}})
}

// start runs the kubelock binary as u in ns.
func start(u user, ns string, args ...string) *gexec.Session {
	cmd := exec.Command(kubelock, append([]string{"--kubeconfig", u.kubeconfig, "-n", ns, "--identity", u.name}, args...)...)
	s, err := gexec.Start(cmd, GinkgoWriter, GinkgoWriter)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() { s.Kill().Wait() })
	return s
}

// kl runs the kubelock binary as u in ns to its end and returns its session.
func kl(u user, ns string, args ...string) *gexec.Session {
	s := start(u, ns, args...)
	Eventually(s).Should(gexec.Exit())
	return s
}

// dumpLock prints the lock to the Ginkgo log when the spec failed.
func dumpLockOnFailure(ctx context.Context, ns, name string) {
	DeferCleanup(func() {
		if !CurrentSpecReport().Failed() {
			return
		}
		l := &locksv1alpha1.DistributedLock{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, l); err == nil {
			GinkgoWriter.Printf("lock %s/%s at failure: %+v\n", ns, name, l.Status)
		}
		events := &corev1.EventList{}
		if err := env.Client.List(ctx, events, client.InNamespace(ns)); err == nil {
			for _, e := range events.Items {
				GinkgoWriter.Printf("event %s %s: %s\n", e.Reason, e.InvolvedObject.Name, e.Message)
			}
		}
	})
}

// stderrLines is the session's stderr as lines.
func stderrLines(s *gexec.Session) []string {
	return strings.Split(strings.TrimSuffix(string(s.Err.Contents()), "\n"), "\n")
}
