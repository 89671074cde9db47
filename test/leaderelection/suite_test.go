// Package leaderelection tests pkg/lock/leaderelection end to end: two
// controller-runtime managers, each a process of its own, elect on a
// DistributedLock behind the admission webhook, with the kubelock controller
// expiring lapsed holdings; the same managers on a coordination.k8s.io Lease
// are the yardstick.
package leaderelection

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/kubelock/kubelock/test/suite"
)

func TestMain(m *testing.M) {
	if os.Getenv(envRole) == "candidate" {
		os.Exit(runCandidate())
	}
	os.Exit(m.Run())
}

func TestLeaderElection(t *testing.T) {
	suite.Run(t, "leader election on kubelock", 60*time.Second, 10*time.Millisecond)
}

var workDir string

var _ = BeforeSuite(func() {
	workDir = GinkgoT().TempDir()
	suite.Start(suite.ControllerUser)
	// The operator's default expiry grace (2 s): failover figures are the
	// ones a cluster sees.
	DeferCleanup(suite.RunController(suite.ControllerUser))
})

// timings are the elector's: lease duration, renew deadline, retry period.
type timings [3]time.Duration

func (t timings) String() string { return fmt.Sprintf("%s %s %s", t[0], t[1], t[2]) }

// testTimings are short enough for a test and keep client-go's 2 s retry
// period, which is what a Lease candidate's hand-off waits for.
var testTimings = timings{8 * time.Second, 4 * time.Second, 2 * time.Second}

// event is one line a candidate reported.
type event struct {
	what string
	at   time.Time
	args []string
}

// candidate is a manager running in a child process.
type candidate struct {
	id, kind string
	ns, name string
	cmd      *exec.Cmd
	log      string

	mu     sync.Mutex
	events []event
}

// startCandidate runs a manager electing on kind's lock ns/name as id, with
// the credentials in kubeconfig.
func startCandidate(kind, ns, name, id, kubeconfig string, t timings) *candidate {
	c := &candidate{id: id, kind: kind, ns: ns, name: name, log: filepath.Join(workDir, fmt.Sprintf("%s-%s-%s.log", ns, name, id))}
	stderr, err := os.Create(c.log)
	Expect(err).NotTo(HaveOccurred())
	c.cmd = exec.Command(os.Args[0])
	c.cmd.Env = append(os.Environ(), envRole+"=candidate", envKubeconfig+"="+kubeconfig, envKind+"="+kind,
		envNamespace+"="+ns, envName+"="+name, envIdentity+"="+id, envTimings+"="+t.String())
	c.cmd.Stderr = stderr
	stdout, err := c.cmd.StdoutPipe()
	Expect(err).NotTo(HaveOccurred())
	Expect(c.cmd.Start()).To(Succeed())
	go c.read(stdout, stderr)
	DeferCleanup(func() {
		_ = c.cmd.Process.Kill()
		if CurrentSpecReport().Failed() {
			out, _ := os.ReadFile(c.log)
			AddReportEntry("log of "+id, string(out))
		}
	})
	return c
}

func (c *candidate) read(stdout interface{ Read([]byte) (int, error) }, stderr *os.File) {
	defer func() {
		_ = c.cmd.Wait()
		_ = stderr.Close()
	}()
	s := bufio.NewScanner(stdout)
	for s.Scan() {
		f := strings.Fields(s.Text())
		if len(f) < 2 {
			continue
		}
		ns, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		ev := event{what: f[0], at: time.Unix(0, ns)}
		for _, a := range f[2:] {
			if u, err := strconv.Unquote(a); err == nil {
				a = u
			}
			ev.args = append(ev.args, a)
		}
		c.mu.Lock()
		c.events = append(c.events, ev)
		c.mu.Unlock()
	}
}

// nth returns the n-th (from 1) event named what, false while there is none.
func (c *candidate) nth(what string, n int) (event, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ev := range c.events {
		if ev.what == what {
			if n--; n == 0 {
				return ev, true
			}
		}
	}
	return event{}, false
}

// await waits for the n-th event named what.
func (c *candidate) await(what string, n int, timeout time.Duration) event {
	GinkgoHelper()
	var ev event
	Eventually(func() bool {
		var ok bool
		ev, ok = c.nth(what, n)
		return ok
	}).WithTimeout(timeout).Should(BeTrue(), "%s reports %s #%d", c.id, what, n)
	return ev
}

// has reports whether an event named what was reported.
func (c *candidate) has(what string) bool {
	_, ok := c.nth(what, 1)
	return ok
}

// token is the fencing token a LEADING event reported.
func (ev event) token() int64 {
	GinkgoHelper()
	Expect(ev.args).NotTo(BeEmpty())
	t, err := strconv.ParseInt(ev.args[0], 10, 64)
	Expect(err).NotTo(HaveOccurred())
	return t
}

// signal sends sig to the candidate and returns when it was sent.
func (c *candidate) signal(sig syscall.Signal) time.Time {
	GinkgoHelper()
	at := time.Now()
	Expect(c.cmd.Process.Signal(sig)).To(Succeed())
	return at
}

// standingBy waits until the candidate stands by as it would for good. On
// kubelock: its elector asks and blocks while the campaign waits in the
// lock's queue. On a Lease: its elector heard of the current leader and
// polls again.
func (c *candidate) standingBy(ctx context.Context) {
	GinkgoHelper()
	if c.kind == kindKubelock {
		c.await("ASKING", 1, 60*time.Second)
		Eventually(func() []string { return waiters(ctx, c.ns, c.name) }).Should(ContainElement(c.id))
		return
	}
	c.await("OBSERVED", 1, 60*time.Second)
	c.await("ASKING", 2, 60*time.Second)
}

// writeKubeconfig writes cfg's server and credentials to a kubeconfig file.
func writeKubeconfig(name string, cfg *rest.Config) string {
	GinkgoHelper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	kc.CurrentContext = "c"
	path := filepath.Join(workDir, name+".kubeconfig")
	Expect(clientcmd.WriteToFile(*kc, path)).To(Succeed())
	return path
}

// grantLeases lets user elect on Leases in ns, as controller-runtime's
// leader election needs.
func grantLeases(ctx context.Context, ns, user string) {
	GinkgoHelper()
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "leases-" + user},
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"},
			Verbs: []string{"get", "list", "watch", "create", "update"},
		}},
	}
	Expect(suite.Env.Client.Create(ctx, role)).To(Succeed())
	Expect(suite.Env.Client.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	})).To(Succeed())
}
