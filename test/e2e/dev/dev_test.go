// Package dev runs kubelock-dev (what `make dev` runs) as a process, follows
// the next steps it prints with the real kubectl and the kubectl-lock plugin,
// and checks that SIGTERM leaves no process and no listening port behind.
package dev

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/gbytes"
	"github.com/onsi/gomega/gexec"

	"github.com/kubelock/kubelock/cmd/kubelock-dev/devenv"
	"github.com/kubelock/kubelock/internal/proc"
	"github.com/kubelock/kubelock/test/suite"
	"github.com/kubelock/kubelock/test/testenv"
	"github.com/kubelock/kubelock/webhook"
)

// kubelock, kubelockDev and kubelock-apiserver are built into one folder, as
// make builds them into bin/.
var kubelock, kubelockDev string

func TestDev(t *testing.T) {
	suite.Run(t, "kubelock-dev end-to-end suite", 30*time.Second, 25*time.Millisecond)
}

var _ = BeforeSuite(func() {
	if _, err := os.Stat(filepath.Join(testenv.AssetsDir(), "kubectl")); err != nil {
		Skip("no control plane build (make control-plane): " + err.Error())
	}
	dir := GinkgoT().TempDir()
	kubelock, kubelockDev = filepath.Join(dir, "kubelock"), filepath.Join(dir, "kubelock-dev")
	for bin, pkg := range map[string]string{kubelock: "./cmd/kubelock", kubelockDev: "./cmd/kubelock-dev",
		filepath.Join(dir, "kubelock-apiserver"): "./cmd/kubelock-apiserver"} {
		build := exec.Command("go", "build", "-o", bin, pkg)
		build.Dir = testenv.RepoRoot()
		out, err := build.CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), "go build %s: %s", pkg, out)
	}
})

// freePorts are n ports nothing listens on, reserved for this process.
func freePorts(n int) []int {
	ports, err := proc.FreePorts(n)
	Expect(err).NotTo(HaveOccurred())
	return ports
}

func portOf(ln net.Listener) int {
	addr, ok := ln.Addr().(*net.TCPAddr)
	Expect(ok).To(BeTrue())
	return addr.Port
}

func devCommand(dataDir string, ports []int, extra ...string) *exec.Cmd {
	args := []string{"--data-dir", dataDir, "--assets-dir", testenv.AssetsDir(),
		"--apiserver-port", strconv.Itoa(ports[0]), "--etcd-port", strconv.Itoa(ports[1]),
		"--etcd-peer-port", strconv.Itoa(ports[2]), "--webhook-port", strconv.Itoa(ports[3])}
	cmd := exec.Command(kubelockDev, append(args, extra...)...)
	cmd.Dir = testenv.RepoRoot() // the next steps apply config/samples/ from here
	return cmd
}

// children are the processes whose parent is pid, from /proc.
func children(pid int) []int {
	var out []int
	entries, err := os.ReadDir("/proc")
	Expect(err).NotTo(HaveOccurred())
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		status, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(status), "\n") {
			if ppid, ok := strings.CutPrefix(line, "PPid:"); ok && strings.TrimSpace(ppid) == strconv.Itoa(pid) {
				out = append(out, p)
			}
		}
	}
	return out
}

// step is one printed next step, without its comment.
type step struct{ cmd, comment string }

// lockColumns are the printer columns of `kubectl get dlock`, on either backend.
const lockColumns = `(?m)^NAME\s+TYPE\s+HOLDERS\s+HOLDER\s+TOKEN\s+WAITERS\s+AGE$`

var _ = Describe("kubelock-dev", func() {
	// deniedBy is how the apiserver's denial names the engine; admissionLine
	// what kubelock-dev prints of it.
	DescribeTable("starts a local kubelock whose printed next steps work, and leaves nothing behind on SIGTERM", func(backend, admission, admissionLine, deniedBy string) {
		dataDir := filepath.Join(GinkgoT().TempDir(), "dev")
		ports := freePorts(4)
		started := time.Now()
		s, err := gexec.Start(devCommand(dataDir, ports, "--backend", backend, "--admission", admission), GinkgoWriter, GinkgoWriter)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { s.Kill().Wait() })
		Eventually(s.Out, 2*time.Minute).Should(gbytes.Say(`(?m)^` + regexp.QuoteMeta(devenv.ReadyLine) + `$`))
		GinkgoWriter.Printf("ready after %s\n", time.Since(started))
		Eventually(s.Out).Should(gbytes.Say(`kubectl lock force-release --session.*\n`))
		Expect(bytes.Count(s.Out.Contents(), []byte(devenv.ReadyLine))).To(Equal(1))
		Expect(string(s.Out.Contents())).To(And(MatchRegexp(`(?m)^  backend\s+`+backend+`: `), MatchRegexp(`(?m)^  admission\s+`+admissionLine)))

		// The next steps, as printed.
		var steps []step
		sc := bufio.NewScanner(bytes.NewReader(s.Out.Contents()))
		for inSteps := false; sc.Scan(); {
			line := sc.Text()
			if strings.HasPrefix(line, "Next steps") {
				inSteps = true
				continue
			}
			if !inSteps || strings.TrimSpace(line) == "" {
				continue
			}
			cmd, comment, _ := strings.Cut(line, "#")
			steps = append(steps, step{strings.TrimSpace(cmd), strings.TrimSpace(comment)})
		}
		Expect(steps).NotTo(BeEmpty())

		env := os.Environ()
		var leaseID, session string
		ran := 0
		for _, st := range steps {
			By(st.cmd)
			if v, ok := strings.CutPrefix(st.cmd, "export "); ok {
				name, value, _ := strings.Cut(v, "=")
				out, err := exec.Command("sh", "-c", fmt.Sprintf("%s; printf %%s \"$%s\"", st.cmd, name)).Output()
				Expect(err).NotTo(HaveOccurred())
				env = append(env, name+"="+string(out))
				Expect(value).NotTo(BeEmpty())
				ran++
				continue
			}
			cmdline := strings.NewReplacer("<LEASE-ID>", leaseID, "<bob's LEASE-ID>", leaseID, "<SESSION>", session).Replace(st.cmd)
			var cmd *exec.Cmd
			var stdout, stderr bytes.Buffer
			var err error
			var out string
			runStep := func() {
				cmd = exec.Command("sh", "-c", cmdline)
				cmd.Env, cmd.Dir = env, testenv.RepoRoot()
				stdout.Reset()
				stderr.Reset()
				cmd.Stdout, cmd.Stderr = &stdout, &stderr
				err = cmd.Run()
				out = stdout.String() + stderr.String()
			}
			runStep()
			if st.cmd == "kubectl lock sessions" {
				// The controller counts the session's locks shortly after they are taken.
				Eventually(func() string { runStep(); return out }).Should(MatchRegexp(`(?m)^` + session + `\s+alice\s+\S+\s+5m\s+\S+\s+3\s`))
			}
			GinkgoWriter.Printf("$ %s\n%s", cmdline, out)
			ran++
			switch {
			case strings.Contains(st.cmd, "apply -k config/samples/"):
				Expect(err).NotTo(HaveOccurred(), out)
				Expect(out).To(ContainSubstring("distributedlock.locks.kubelock.io/orders-db created"))
				// kubelock-dev created the sample RBAC as this apply would: no
				// warning about kubectl's missing record, nothing to change.
				Expect(stderr.String()).To(BeEmpty())
				for _, obj := range []string{"serviceaccount/kubelock-worker", "role.rbac.authorization.k8s.io/kubelock-lock-user", "rolebinding.rbac.authorization.k8s.io/kubelock-lock-user"} {
					Expect(out).To(ContainSubstring(obj+" unchanged"), out)
				}
			case st.cmd == "kubectl get dlock":
				Expect(err).NotTo(HaveOccurred(), out)
				Expect(out).To(And(MatchRegexp(lockColumns), ContainSubstring("demo"), ContainSubstring("orders-db")))
			case strings.Contains(st.cmd, "--session-ttl"):
				Expect(err).NotTo(HaveOccurred(), out)
				// NAME TOKEN LEASE-ID EXPIRES-AT EXPIRES-IN SESSION, one row per lock
				rows := regexp.MustCompile(`(?m)^(stock-[123])\s+[0-9]+\s+[0-9a-f]{32}\s+\S+\s+\S+\s+(\S+)$`).FindAllStringSubmatch(stdout.String(), -1)
				Expect(rows).To(HaveLen(3), out)
				session = rows[0][2]
				for _, r := range rows {
					Expect(r[2]).To(Equal(session), "one session for the three locks")
				}
			case st.cmd == "kubectl lock sessions":
				Expect(err).NotTo(HaveOccurred(), out)
			case strings.Contains(st.cmd, "force-release --session"):
				Expect(err).NotTo(HaveOccurred(), out)
				Expect(out).To(MatchRegexp(`force-released session default/` + session + ` of alice \(.*\): 3 lock\(s\) held in it end with SessionClosed`))
				Expect(out).To(And(ContainSubstring("stock-1"), ContainSubstring("stock-2"), ContainSubstring("stock-3")))
			case strings.Contains(st.cmd, "lock acquire demo"):
				Expect(err).NotTo(HaveOccurred(), out)
				// NAME TOKEN LEASE-ID EXPIRES-AT EXPIRES-IN
				m := regexp.MustCompile(`(?m)^demo\s+([0-9]+)\s+([0-9a-f]{32})\s`).FindStringSubmatch(stdout.String())
				Expect(m).NotTo(BeNil(), "no token and lease in %q", out)
				token, _ := strconv.ParseInt(m[1], 10, 64)
				Expect(token).To(BeNumerically(">", 0))
				leaseID = m[2]
				// kubectl prints the holding in the printer columns.
				get := exec.Command("kubectl", "get", "distributedlocks", "demo")
				get.Env = env
				got, err := get.CombinedOutput()
				Expect(err).NotTo(HaveOccurred(), string(got))
				Expect(string(got)).To(And(MatchRegexp(lockColumns), MatchRegexp(`(?m)^demo\s+Mutex\s+1\s+\S+\s+`+m[1]+`\s+0\s`)))
			case strings.Contains(st.cmd, "--context alice") && strings.Contains(st.cmd, "release"):
				Expect(err).To(HaveOccurred(), out)
				Expect(cmd.ProcessState.ExitCode()).To(Equal(77), out)
				Expect(stderr.String()).To(ContainSubstring("[kubelock:holder-only]"))
				Expect(stderr.String()).To(ContainSubstring(deniedBy))
				Expect(st.comment).To(ContainSubstring("[kubelock:holder-only]"))
			case strings.Contains(st.cmd, "lock release demo"):
				Expect(err).NotTo(HaveOccurred(), out)
				Expect(out).To(ContainSubstring("released default/demo (lease " + leaseID + ")"))
			case strings.Contains(st.cmd, "--context alice get dlock demo"):
				Expect(err).NotTo(HaveOccurred(), out)
				Expect(out).To(ContainSubstring("demo"))
			case strings.Contains(st.cmd, "force-release demo"):
				Expect(err).NotTo(HaveOccurred(), out)
				Expect(out).To(ContainSubstring("ended lease " + leaseID))
			case st.cmd == "kubectl lock describe demo":
				Expect(err).NotTo(HaveOccurred(), out)
				Expect(out).To(And(ContainSubstring("ForceReleased"), ContainSubstring("carol")))
			default:
				Fail("a printed step this test does not know: " + st.cmd)
			}
		}
		Expect(ran).To(Equal(len(steps)))

		By("listing the admission configurations: one engine for lock writes, the fenced-objects webhook either way")
		out, err := exec.Command(filepath.Join(testenv.AssetsDir(), "kubectl"), "--kubeconfig", filepath.Join(dataDir, "kubeconfig"),
			"get", "validatingwebhookconfigurations,validatingadmissionpolicies", "-o", "name").CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), string(out))
		configs := strings.Fields(string(out))
		Expect(configs).To(ContainElement("validatingwebhookconfiguration.admissionregistration.k8s.io/" + devenv.FencedWebhookConfigName))
		lockWebhook := "validatingwebhookconfiguration.admissionregistration.k8s.io/" + devenv.WebhookConfigName
		policies := ContainElements(
			"validatingadmissionpolicy.admissionregistration.k8s.io/kubelock-distributedlocks",
			"validatingadmissionpolicy.admissionregistration.k8s.io/kubelock-distributedlocks-metadata",
			"validatingadmissionpolicy.admissionregistration.k8s.io/kubelock-locksessions")
		switch {
		case backend == "apiserver":
			Expect(configs).NotTo(Or(ContainElement(lockWebhook), ContainElement(HavePrefix("validatingadmissionpolicy."))))
			crds, err := exec.Command(filepath.Join(testenv.AssetsDir(), "kubectl"), "--kubeconfig", filepath.Join(dataDir, "kubeconfig"), "get", "crd", "-o", "name").CombinedOutput()
			Expect(err).NotTo(HaveOccurred(), string(crds))
			Expect(string(crds)).NotTo(ContainSubstring("locks.kubelock.io"), "no lock CRDs")
		case admission == devenv.AdmissionPolicy:
			Expect(configs).To(And(policies, Not(ContainElement(lockWebhook))))
		default:
			Expect(configs).To(And(ContainElement(lockWebhook), Not(ContainElement(HavePrefix("validatingadmissionpolicy.")))))
		}

		By("reading kubelock-dev's log: quiet, no refused handshake of its own probes")
		Expect(string(s.Err.Contents())).NotTo(ContainSubstring("TLS handshake error"))

		By("posting an AdmissionReview to the webhook as anyone but the apiserver")
		// The apiserver presents a client certificate of its own CA; nobody else gets past TLS.
		review := `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1","operation":"DELETE","namespace":"default","name":"demo"}}`
		//nolint:gosec // a stranger trusts anyone
		stranger := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
		url := fmt.Sprintf("https://127.0.0.1:%d%s", ports[3], webhook.Path)
		_, err = stranger.Post(url, "application/json", strings.NewReader(review)) //nolint:noctx // a local test endpoint
		Expect(err).To(MatchError(ContainSubstring("certificate required")), "the webhook answers only the apiserver")

		By("SIGTERM")
		kids := children(s.Command.Process.Pid)
		if backend == "apiserver" {
			Expect(kids).To(HaveLen(5), "etcd, kube-apiserver, kube-controller-manager, the lock store's etcd and kubelock-apiserver")
		} else {
			Expect(kids).To(HaveLen(3), "etcd, kube-apiserver and kube-controller-manager")
		}
		s.Terminate()
		Eventually(s, time.Minute).Should(gexec.Exit(0))
		Expect(s.Err).To(gbytes.Say("stopping"))
		for _, pid := range kids {
			// Reaped by kubelock-dev: gone from /proc (not even a zombie).
			_, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid)))
			Expect(os.IsNotExist(err)).To(BeTrue(), "process %d is still there", pid)
			Expect(syscall.Kill(pid, 0)).To(MatchError(syscall.ESRCH))
		}
		for _, p := range ports {
			ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
			Expect(err).NotTo(HaveOccurred(), "port %d is still taken", p)
			Expect(ln.Close()).To(Succeed())
		}
	},
		Entry("with the admission webhook", "crd", devenv.AdmissionWebhook, "webhook: ", "admission webhook"),
		// The chart's admission.engine=policy: no webhook sees lock writes.
		Entry("with the policy engine", "crd", devenv.AdmissionPolicy, "policy: ", "ValidatingAdmissionPolicy"),
		// The lock API from kubelock-apiserver, which runs the rules itself.
		Entry("on the lock apiserver", "apiserver", devenv.AdmissionWebhook, "in kubelock-apiserver: ", "is forbidden: "),
	)

	It("refuses, in one line, to switch a persisted cluster to the lock apiserver while the CRDs hold locks", func() {
		dataDir := filepath.Join(GinkgoT().TempDir(), "dev")
		ports := freePorts(4)
		// --persist: etcd syncs its writes, slow on a busy disk.
		s, err := gexec.Start(devCommand(dataDir, ports, "--persist", "--start-timeout", "3m"), GinkgoWriter, GinkgoWriter)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { s.Kill().Wait() })
		Eventually(s.Out, 5*time.Minute).Should(gbytes.Say(`(?m)^` + regexp.QuoteMeta(devenv.ReadyLine) + `$`))
		s.Terminate()
		Eventually(s, time.Minute).Should(gexec.Exit(0))

		s, err = gexec.Start(devCommand(dataDir, ports, "--persist", "--start-timeout", "3m", "--backend", "apiserver"), GinkgoWriter, GinkgoWriter)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { s.Kill().Wait() })
		Eventually(s, 5*time.Minute).Should(gexec.Exit(1))
		lines := strings.Split(strings.TrimSpace(string(s.Err.Contents())), "\n")
		// The demo lock is the one lock kubelock-dev created on the CRD backend.
		Expect(lines[len(lines)-1]).To(Equal("kubelock-dev: refusing to serve locks.kubelock.io/v1alpha1 from the apiserver backend: " +
			"the crd backend serves it (CRDs distributedlocks.locks.kubelock.io, locksessions.locks.kubelock.io) and holds 1 DistributedLock(s) and 0 LockSession(s); " +
			"each backend's fencing tokens come from its own etcd's revisions, so locks are never carried across, which could give them lower tokens. " +
			"Stay on the crd backend, or release and delete them, then remove it (kubectl delete crd distributedlocks.locks.kubelock.io locksessions.locks.kubelock.io) and switch"))
		Expect(s.Err).NotTo(gbytes.Say("kubelock-apiserver up"), "refused before it starts the lock apiserver")
	})

	It("says in one line which port is taken", func() {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		Expect(err).NotTo(HaveOccurred())
		defer func() { _ = ln.Close() }()
		ports := freePorts(4)
		ports[0] = portOf(ln)
		s, err := gexec.Start(devCommand(filepath.Join(GinkgoT().TempDir(), "dev"), ports), GinkgoWriter, GinkgoWriter)
		Expect(err).NotTo(HaveOccurred())
		Eventually(s).Should(gexec.Exit(1))
		Expect(string(s.Err.Contents())).To(Equal(fmt.Sprintf("kubelock-dev: port %d for the kube-apiserver (--apiserver-port) is already in use (another kubelock-dev?): stop what listens there or choose another port with --apiserver-port\n", ports[0])))
		Expect(s.Out.Contents()).To(BeEmpty())
	})

	It("names make control-plane when the binaries are missing", func() {
		cmd := devCommand(filepath.Join(GinkgoT().TempDir(), "dev"), freePorts(4), "--assets-dir", GinkgoT().TempDir())
		s, err := gexec.Start(cmd, GinkgoWriter, GinkgoWriter)
		Expect(err).NotTo(HaveOccurred())
		Eventually(s).Should(gexec.Exit(1))
		lines := strings.Split(strings.TrimSpace(string(s.Err.Contents())), "\n")
		Expect(lines).To(HaveLen(1))
		Expect(lines[0]).To(And(HavePrefix("kubelock-dev: no etcd binary at "), ContainSubstring("make control-plane")))
	})

	It("is what kubelock dev runs, and kubelock dev says in one line where to get it when it is missing", func() {
		assets := GinkgoT().TempDir()
		s, err := gexec.Start(exec.Command(kubelock, "dev", "--assets-dir", assets), GinkgoWriter, GinkgoWriter)
		Expect(err).NotTo(HaveOccurred())
		Eventually(s).Should(gexec.Exit(1))
		Expect(string(s.Err.Contents())).To(HavePrefix("kubelock-dev: no etcd binary at " + filepath.Join(assets, "etcd")))

		alone := filepath.Join(GinkgoT().TempDir(), "kubelock")
		Expect(os.Link(kubelock, alone)).To(Succeed())
		cmd := exec.Command(alone, "dev")
		cmd.Env = append(os.Environ(), "PATH="+GinkgoT().TempDir())
		s, err = gexec.Start(cmd, GinkgoWriter, GinkgoWriter)
		Expect(err).NotTo(HaveOccurred())
		Eventually(s).Should(gexec.Exit(1))
		Expect(string(s.Err.Contents())).To(Equal("kubelock: kubelock dev runs kubelock-dev, which is neither next to kubelock nor on PATH: build it with `make kubelock-dev` (or run `make dev`)\n"))
	})
})
