package dev

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/gbytes"
	"github.com/onsi/gomega/gexec"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kubelock/kubelock/cmd/kubelock-dev/devenv"
	"github.com/kubelock/kubelock/pkg/lock"
)

var _ = Describe("kubelock-dev --ha", func() {
	It("runs three etcd members and two apiservers behind HAProxy, prints every endpoint and serves a lock through the balancer", func(ctx SpecContext) {
		dataDir := filepath.Join(GinkgoT().TempDir(), "dev")
		ports := freePorts(4)
		s, err := gexec.Start(devCommand(dataDir, ports, "--ha"), GinkgoWriter, GinkgoWriter)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { s.Kill().Wait() })
		Eventually(s.Out, 3*time.Minute).Should(gbytes.Say(`(?m)^` + regexp.QuoteMeta(devenv.ReadyLine) + `$`))
		balancer := fmt.Sprintf("https://127.0.0.1:%d", ports[0])
		Expect(string(s.Err.Contents())).To(ContainSubstring("load balancer (HAProxy) up on " + balancer + " in front of 2 kube-apiservers"))

		By("reading the printed endpoints: the balancer, each apiserver's own URL, the etcd members")
		m := regexp.MustCompile(`(?m)^  apiserver\s+(\S+): HAProxy in front of kube-apiserver0 (\S+), kube-apiserver1 (\S+) \(etcd members on (.*)\)$`).
			FindStringSubmatch(string(s.Out.Contents()))
		Expect(m).NotTo(BeNil(), "no HA endpoints line in %s", s.Out.Contents())
		Expect(m[1]).To(Equal(balancer))
		Expect(m[4]).To(MatchRegexp(fmt.Sprintf(`^http://127\.0\.0\.1:%d, http://127\.0\.0\.1:\d+, http://127\.0\.0\.1:\d+$`, ports[1])))

		kubeconfig := filepath.Join(dataDir, "kubeconfig")
		admin, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		Expect(err).NotTo(HaveOccurred())
		Expect(admin.Host).To(Equal(balancer), "the kubeconfig points at the balancer")
		for _, url := range m[2:4] {
			Expect(readyz(ctx, admin, url)).To(Equal(http.StatusOK), "%s answers on its own", url)
		}

		By("acquiring and releasing demo as alice through the balancer")
		alice, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			&clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig}, &clientcmd.ConfigOverrides{CurrentContext: "alice"}).ClientConfig()
		Expect(err).NotTo(HaveOccurred())
		Expect(alice.Host).To(Equal(balancer))
		lc, err := lock.New(alice, lock.WithNamespace("default"))
		Expect(err).NotTo(HaveOccurred())
		l, err := lc.TryAcquire(ctx, "demo")
		Expect(err).NotTo(HaveOccurred())
		Expect(l.FencingToken()).To(BeNumerically(">", 0))
		Expect(l.Release(ctx)).To(Succeed())

		By("SIGTERM")
		kids := children(s.Command.Process.Pid)
		Expect(kids).To(HaveLen(7), "3 etcd members, 2 kube-apiservers, HAProxy and kube-controller-manager")
		s.Terminate()
		Eventually(s, time.Minute).Should(gexec.Exit(0))
		for _, pid := range kids {
			_, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid)))
			Expect(os.IsNotExist(err)).To(BeTrue(), "process %d is still there", pid)
			Expect(syscall.Kill(pid, 0)).To(MatchError(syscall.ESRCH))
		}
	})
})

// readyz is the status of url's /readyz, asked as cfg's user.
func readyz(ctx context.Context, cfg *rest.Config, url string) int {
	hc, err := rest.HTTPClientFor(cfg)
	Expect(err).NotTo(HaveOccurred())
	defer hc.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/readyz", nil)
	Expect(err).NotTo(HaveOccurred())
	resp, err := hc.Do(req)
	Expect(err).NotTo(HaveOccurred())
	Expect(resp.Body.Close()).To(Succeed())
	return resp.StatusCode
}
