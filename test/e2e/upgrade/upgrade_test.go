package upgrade

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/gexec"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/internal/proc"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/suite"
	"github.com/kubelock/kubelock/test/testenv"
)

// lease is every holding's: short, so that the spec sees several renewals
// across the upgrade, long enough for a loaded machine's renewals (every
// third of it) to land.
const lease = 9 * time.Second

// holding is one of the previous release's clients: a `kubelock run` that
// holds until its file exists.
type holding struct {
	name, lock string
	args       []string
	session    *gexec.Session
	leaseID    string
}

// release ends the wrapped command, so that run releases and exits.
func (h *holding) release() {
	Expect(os.WriteFile(filepath.Join(workDir, h.name+".done"), nil, 0o600)).To(Succeed())
}

var _ = Describe("upgrading from the previous release", Ordered, func() {
	var (
		env      *testenv.Env
		ns       string
		old, cur *manager
		holdings map[string]*holding
		upgraded time.Time
	)

	BeforeAll(func(ctx SpecContext) {
		var err error
		env, err = testenv.Start(func(e *envtest.Environment) {
			e.CRDDirectoryPaths = []string{filepath.Join(previous, "config", "crd", "bases")}
			e.WebhookInstallOptions.Paths = []string{filepath.Join(previous, "config", "webhook")}
		})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(env.Stop()).To(Succeed()) })
		// Cleanups run last-in first-out: the processes stop before the control plane.
		DeferCleanup(func() {
			for _, h := range holdings {
				h.session.Kill().Wait()
			}
			for _, m := range []*manager{cur, old} {
				if m != nil {
					m.Terminate().Wait(time.Minute)
				}
			}
		})
		suite.Env = env
		old = startManager(ctx, env, "previous", filepath.Join(previous, "manager"), env.WebhookInstallOptions.LocalServingPort)
		ns = suite.Namespace(ctx)
	})

	AfterEach(func(ctx SpecContext) {
		if !CurrentSpecReport().Failed() {
			return
		}
		locks := &locksv1alpha1.DistributedLockList{}
		Expect(env.Client.List(ctx, locks, client.InNamespace(ns))).To(Succeed())
		for _, l := range locks.Items {
			GinkgoWriter.Printf("lock %s at failure: %+v\n", l.Name, l.Status)
		}
		sessions := &locksv1alpha1.LockSessionList{}
		Expect(env.Client.List(ctx, sessions, client.InNamespace(ns))).To(Succeed())
		for _, s := range sessions.Items {
			GinkgoWriter.Printf("session %s at failure: %+v %+v\n", s.Name, s.Spec, s.Status)
		}
		for _, h := range holdings {
			GinkgoWriter.Printf("client %s at failure: exit %d, stderr:\n%s\n", h.name, h.session.ExitCode(), h.session.Err.Contents())
		}
	})

	It("has the previous release's clients holding, sharing and queueing under its operator", func(ctx SpecContext) {
		create := func(name string, spec locksv1alpha1.DistributedLockSpec) {
			spec.LeaseDurationSeconds = int32(lease.Seconds())
			Expect(env.Client.Create(ctx, &locksv1alpha1.DistributedLock{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec})).To(Succeed())
		}
		create("orders", locksv1alpha1.DistributedLockSpec{})
		create("plain", locksv1alpha1.DistributedLockSpec{})
		create("catalog", locksv1alpha1.DistributedLockSpec{Type: locksv1alpha1.RWMutex})
		create("indexers", locksv1alpha1.DistributedLockSpec{Type: locksv1alpha1.Semaphore, Permits: ptr.To[int32](2)})

		holdings = map[string]*holding{}
		for _, h := range []*holding{
			{name: "holder", lock: "orders"},                                        // in a LockSession (run's default)
			{name: "unsessioned", lock: "plain", args: []string{"--session=false"}}, // renews the lock itself
			{name: "reader-1", lock: "catalog", args: []string{"--shared"}},
			{name: "reader-2", lock: "catalog", args: []string{"--shared"}},
			{name: "permit", lock: "indexers"},
		} {
			holdings[h.name] = runPrevious(ctx, ns, h)
		}
		Eventually(func(g Gomega) {
			g.Expect(holderOf(ctx, env, ns, "orders")).To(Equal("holder"))
			g.Expect(holderOf(ctx, env, ns, "plain")).To(Equal("unsessioned"))
			g.Expect(getLock(ctx, env, ns, "catalog").Status.SharedHolders).To(HaveLen(2))
			g.Expect(getLock(ctx, env, ns, "indexers").Status.SharedHolders).To(HaveLen(1))
		}).Should(Succeed())
		// The waiter queues behind the holder, also with the previous release.
		holdings["waiter"] = runPrevious(ctx, ns, &holding{name: "waiter", lock: "orders"})
		Eventually(func() []locksv1alpha1.Waiter { return getLock(ctx, env, ns, "orders").Status.Waiters }).Should(HaveLen(1))
		for _, h := range holdings {
			h.leaseID = leaseIDOf(getLock(ctx, env, ns, h.lock), h.name)
			Expect(h.leaseID).NotTo(BeEmpty(), "%s holds or waits", h.name)
		}
	})

	It("upgrades the CRDs, the webhook and the operator without refusing a write of theirs", func(ctx SpecContext) {
		cur = startManager(ctx, env, "current", current, freePort())
		_, err := envtest.InstallCRDs(env.Config, envtest.CRDInstallOptions{
			Paths: []string{filepath.Join(testenv.RepoRoot(), "config", "crd", "bases")}, ErrorIfPathMissing: true})
		Expect(err).NotTo(HaveOccurred())
		pointWebhooksAt(ctx, env, cur.webhook)
		Expect(old.Command.Process.Signal(syscall.SIGTERM)).To(Succeed())
		Eventually(old).WithTimeout(time.Minute).Should(gexec.Exit())
		upgraded = time.Now()

		// Two renewals of every holding after the upgrade, by the previous
		// release's clients, through this release's CRDs and webhook.
		renewedSince := upgraded.Add(lease / 3)
		Eventually(func(g Gomega) {
			for _, h := range holdings {
				if h.name == "waiter" {
					continue
				}
				g.Expect(renewTime(ctx, env, ns, h)).To(BeTemporally(">", renewedSince), h.name)
			}
		}).WithTimeout(3 * lease).Should(Succeed())
		for _, h := range holdings {
			Expect(h.session.ExitCode()).To(Equal(-1), "%s is still running", h.name)
			l := getLock(ctx, env, ns, h.lock)
			Expect(leaseIDOf(l, h.name)).To(Equal(h.leaseID), "%s holds or waits as before", h.name)
			for _, r := range l.Status.RecentAcquisitions {
				Expect(r.EndReason).NotTo(Equal(locksv1alpha1.EndReasonExpired), "nothing expired on %s", h.lock)
			}
		}
	})

	It("admits their releases and hand-offs, and this release's clients take over with higher tokens", func(ctx SpecContext) {
		c, _ := suite.NewClient(ctx, ns)
		next := make(chan *lock.Lock, 1)
		go func() {
			defer GinkgoRecover()
			l, err := c.Acquire(ctx, "orders")
			Expect(err).NotTo(HaveOccurred())
			next <- l
		}()
		Eventually(func() []locksv1alpha1.Waiter { return getLock(ctx, env, ns, "orders").Status.Waiters }).Should(HaveLen(2))

		endsCleanly := func(name string) int64 {
			h := holdings[name]
			token := getLock(ctx, env, ns, h.lock).Status.FencingToken
			h.release()
			Eventually(h.session).Should(gexec.Exit(0), "%s released with the previous release's client", name)
			return token
		}
		endsCleanly("holder")
		Eventually(func() string { return holderOf(ctx, env, ns, "orders") }).Should(Equal("waiter"), "the previous release's waiter took the hand-off")
		waiterToken := endsCleanly("waiter")
		var taken *lock.Lock
		Eventually(next).Should(Receive(&taken))
		Expect(taken.FencingToken()).To(BeNumerically(">", waiterToken))
		Expect(taken.Release(ctx)).To(Succeed())

		endsCleanly("reader-1")
		readersToken := endsCleanly("reader-2")
		writer, err := c.Acquire(ctx, "catalog")
		Expect(err).NotTo(HaveOccurred())
		Expect(writer.FencingToken()).To(BeNumerically(">", readersToken))
		Expect(writer.Release(ctx)).To(Succeed())
		endsCleanly("permit")
	})

	It("has this release's operator expire a holding of the previous release's client that died", func(ctx SpecContext) {
		h := holdings["unsessioned"]
		Expect(h.session.Command.Process.Signal(syscall.SIGKILL)).To(Succeed())
		Eventually(h.session).Should(gexec.Exit())
		last := *getLock(ctx, env, ns, "plain").Status.Holder.RenewTime
		var record locksv1alpha1.FinishedHolding
		Eventually(func(g Gomega) {
			l := getLock(ctx, env, ns, "plain")
			g.Expect(l.Status.Holder).To(BeNil())
			record = l.Status.RecentAcquisitions[len(l.Status.RecentAcquisitions)-1]
		}).WithTimeout(4 * lease).Should(Succeed())
		Expect(record.LeaseID).To(Equal(h.leaseID))
		Expect(record.EndReason).To(Equal(locksv1alpha1.EndReasonExpired))
		Expect(record.EndedBy).To(Equal(suite.ControllerUser))
		Expect(record.EndTime.Time).To(BeTemporally(">=", last.Add(lease)), "not before its lease ran out")
		Expect(cur.ExitCode()).To(Equal(-1), "this release's operator still runs")
	})
})

// runPrevious starts the previous release's `kubelock run` for h as a lock
// user of its own, and returns h with it. The processes live across the
// specs: the container's AfterAll kills them.
func runPrevious(ctx context.Context, ns string, h *holding) *holding {
	cfg, _ := suite.UserConfig(ctx)
	kubeconfig := filepath.Join(workDir, h.name+".kubeconfig")
	suite.WriteKubeconfig(kubeconfig, h.name, cfg)
	done := filepath.Join(workDir, h.name+".done")
	args := append([]string{"--kubeconfig", kubeconfig, "-n", ns, "--identity", h.name,
		"run", h.lock, "--wait", "5m", "--lease", lease.String()}, h.args...)
	args = append(args, "--", "sh", "-c", fmt.Sprintf("until [ -e %s ]; do sleep 0.1; done", done))
	s, err := gexec.Start(exec.Command(filepath.Join(previous, "kubelock"), args...), GinkgoWriter, GinkgoWriter)
	Expect(err).NotTo(HaveOccurred())
	h.session = s
	return h
}

// manager is a release's operator running as a process.
type manager struct {
	*gexec.Session
	webhook string // its webhook server's base URL
}

// startManager runs a release's operator as the controller's user, its
// webhook on port with the test's serving certificate, electing its leader
// on a Lease as both releases do by default; it returns once the operator
// serves its webhook. The container's AfterAll stops it.
func startManager(ctx context.Context, env *testenv.Env, name, bin string, port int) *manager {
	cfg, err := env.ControllerConfig(suite.ControllerUser)
	Expect(err).NotTo(HaveOccurred())
	kubeconfig := filepath.Join(workDir, name+"-manager.kubeconfig")
	suite.WriteKubeconfig(kubeconfig, suite.ControllerUser, cfg)
	o := env.WebhookInstallOptions
	probe := freePort()
	cmd := exec.Command(bin, "--kubeconfig="+kubeconfig,
		"--leader-elect", "--leader-election-namespace=default", "--leader-election-id=kubelock-upgrade",
		"--metrics-bind-address=0", "--health-probe-bind-address=127.0.0.1:"+strconv.Itoa(probe),
		"--webhook-host="+o.LocalServingHost, "--webhook-port="+strconv.Itoa(port), "--webhook-cert-dir="+o.LocalServingCertDir,
		"--webhook-client-ca-file="+env.WebhookClientCAFile, "--cert-rotation=false",
		"--controller-username="+suite.ControllerUser, "--expiry-grace=1s")
	s, err := gexec.Start(cmd, GinkgoWriter, GinkgoWriter)
	Expect(err).NotTo(HaveOccurred())
	Eventually(func() error {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", probe))
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("readyz: %s", resp.Status)
		}
		conn, err := net.Dial("tcp", net.JoinHostPort(o.LocalServingHost, strconv.Itoa(port)))
		if err == nil {
			_ = conn.Close()
		}
		return err
	}).WithContext(ctx).Should(Succeed(), "the %s release's operator serves", name)
	return &manager{Session: s, webhook: "https://" + net.JoinHostPort(o.LocalServingHost, strconv.Itoa(port))}
}

// pointWebhooksAt replaces the validating webhook configurations with this
// release's (config/webhook), served at base.
func pointWebhooksAt(ctx context.Context, env *testenv.Env, base string) {
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "webhook", "manifests.yaml"))
	Expect(err).NotTo(HaveOccurred())
	want := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	Expect(yaml.Unmarshal(data, want)).To(Succeed())
	for i := range want.Webhooks {
		cc := &want.Webhooks[i].ClientConfig
		url := base + *cc.Service.Path
		cc.Service, cc.URL, cc.CABundle = nil, &url, env.WebhookInstallOptions.LocalServingCAData
	}
	got := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	Expect(env.Client.Get(ctx, client.ObjectKey{Name: want.Name}, got)).To(Succeed(), "the previous release's configuration has this name")
	got.Webhooks = want.Webhooks
	Expect(env.Client.Update(ctx, got)).To(Succeed())
}

func getLock(ctx context.Context, env *testenv.Env, ns, name string) *locksv1alpha1.DistributedLock {
	l := &locksv1alpha1.DistributedLock{}
	ExpectWithOffset(1, env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, l)).To(Succeed())
	return l
}

// holderOf is the identity of the lock's exclusive holder, "" when free.
func holderOf(ctx context.Context, env *testenv.Env, ns, name string) string {
	if h := getLock(ctx, env, ns, name).Status.Holder; h != nil {
		return h.Identity
	}
	return ""
}

// leaseIDOf is identity's holding's or queue entry's ID on l.
func leaseIDOf(l *locksv1alpha1.DistributedLock, identity string) string {
	if h := l.Status.Holder; h != nil && h.Identity == identity {
		return h.LeaseID
	}
	for _, h := range l.Status.SharedHolders {
		if h.Identity == identity {
			return h.LeaseID
		}
	}
	for _, w := range l.Status.Waiters {
		if w.Identity == identity {
			return w.RequestID
		}
	}
	return ""
}

// renewTime is when h's holding was last renewed: its session's renewal
// when it holds in one, else the holding's own.
func renewTime(ctx context.Context, env *testenv.Env, ns string, h *holding) time.Time {
	l := getLock(ctx, env, ns, h.lock)
	var holder *locksv1alpha1.LockHolder
	if l.Status.Holder != nil && l.Status.Holder.Identity == h.name {
		holder = l.Status.Holder
	}
	for i := range l.Status.SharedHolders {
		if l.Status.SharedHolders[i].Identity == h.name {
			holder = &l.Status.SharedHolders[i].LockHolder
		}
	}
	if holder == nil {
		return time.Time{}
	}
	if holder.Session != "" {
		s := &locksv1alpha1.LockSession{}
		Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: holder.Session}, s)).To(Succeed())
		if s.Status.RenewTime == nil {
			return time.Time{}
		}
		return s.Status.RenewTime.Time
	}
	if holder.RenewTime == nil {
		return time.Time{}
	}
	return holder.RenewTime.Time
}

// freePort is a loopback TCP port nothing listens on, reserved for this
// process.
func freePort() int {
	p, err := proc.FreePort()
	Expect(err).NotTo(HaveOccurred())
	return p
}
