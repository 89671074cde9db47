//go:build faults

// Package faults is kubelock's fault-injection suite: a three-member etcd
// cluster behind one kube-apiserver with kube-controller-manager, two operator replicas with leader
// election serving the admission webhook behind a TCP balancer, lock clients
// as separate processes behind a fault proxy, and a PostgreSQL table guarded
// by pkg/fencing. Each scenario injects its faults, then checks the recorded
// histories (test/history). Two Describes run their scenarios on control
// planes of their own: "HA control plane" (two kube-apiservers behind
// HAProxy, ha_cluster_test.go) and "lock apiserver backend" (kubelock-apiserver
// serving the lock API, lockapi_cluster_test.go). Run it with `make test-faults`.
//
// Environment:
//
//	FAULTS_SEED     seed of the soak's workload and fault schedule (default: the clock)
//	FAULTS_SOAK     duration of the soak (default 10m)
//	FAULTS_REPORT   where to write the Markdown report (default: the work dir, printed)
//	FAULTS_KEEP     keep the work dir (logs, histories) of a passing run too; a failing
//	                run's is always kept. `go run ./test/history/histcheck -prefix s4
//	                <work dir>/history` says which check fails and where
//	FAULTS_RACE     build the client and manager binaries with -race
//	FAULTS_ELECTION the lock the operator's replicas elect on: lease (default, the
//	                chart's) or kubelock (a DistributedLock with a 6 s lease, 3 s
//	                renew deadline, 1 s retry: what a faster failover needs)
package faults

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubelock/kubelock/test/e2e/faults/wire"

	"github.com/jackc/pgx/v5"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/cmd/manager/operator"
	"github.com/kubelock/kubelock/pkg/fencing/postgres"
	"github.com/kubelock/kubelock/test/faultproxy"
	"github.com/kubelock/kubelock/test/history"
	"github.com/kubelock/kubelock/test/pgtest"
	"github.com/kubelock/kubelock/test/suite"
	"github.com/kubelock/kubelock/test/testenv"
)

const namespace = "faults"

var (
	workDir    string
	clientBin  string
	managerBin string
	cp         *controlPlane
	admin      client.Client
	managers   []*process
	offsets    []string // the managers' wall-clock offset files
	lb         *balancer
	proxy      *faultproxy.Proxy
	pg         *pgtest.Server
	pgDSN      string
	testRec    *history.Recorder
	obs        *observer
	histories  []string
)

func TestFaults(t *testing.T) {
	suite.Run(t, "kubelock fault-injection suite", 60*time.Second, 50*time.Millisecond)
}

var _ = BeforeSuite(func(ctx SpecContext) {
	var err error
	workDir, err = os.MkdirTemp("", "kubelock-faults-")
	Expect(err).NotTo(HaveOccurred())
	GinkgoWriter.Printf("work dir (logs, histories): %s\n", workDir)
	Expect(os.MkdirAll(filepath.Join(workDir, "history"), 0o755)).To(Succeed())
	DeferCleanup(func() {
		if !CurrentSpecReport().Failed() && os.Getenv("FAULTS_KEEP") == "" {
			_ = os.RemoveAll(workDir)
		}
	})

	clientBin, managerBin = filepath.Join(workDir, "client"), filepath.Join(workDir, "manager")
	for bin, pkg := range map[string]string{clientBin: "./test/e2e/faults/client", managerBin: "./cmd/manager"} {
		args := []string{"build", "-tags", "faults", "-o", bin}
		if os.Getenv("FAULTS_RACE") != "" {
			args = append(args, "-race")
		}
		build := exec.Command("go", append(args, pkg)...)
		build.Dir = testenv.RepoRoot()
		out, err := build.CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), "go build %s: %s", pkg, out)
	}
	testRec, err = history.NewRecorder(filepath.Join(workDir, "history", "suite.jsonl"), "suite")
	Expect(err).NotTo(HaveOccurred())
	histories = append(histories, filepath.Join(workDir, "history", "suite.jsonl"))

	// PostgreSQL: the protected resource.
	pg, err = pgtest.Start(ctx)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() { _ = pg.Stop() })
	pgDSN, err = pg.CreateDatabase(ctx, "faults")
	Expect(err).NotTo(HaveOccurred())
	conn, err := pgx.Connect(ctx, pgDSN)
	Expect(err).NotTo(HaveOccurred())
	Expect(postgres.NewGuard(conn).Migrate(ctx)).To(Succeed())
	_, err = conn.Exec(ctx, `CREATE TABLE faults_writes (id bigserial PRIMARY KEY, lock_key text NOT NULL, token bigint NOT NULL, proc text NOT NULL, seq bigint NOT NULL, t bigint NOT NULL)`)
	Expect(err).NotTo(HaveOccurred())
	Expect(conn.Close(ctx)).To(Succeed())

	// Three etcd members, the apiserver and kube-controller-manager.
	cp, err = startControlPlane(ctx, workDir)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(cp.Stop)
	sch, err := operator.Scheme()
	Expect(err).NotTo(HaveOccurred())
	admin, err = client.New(cp.admin, client.Options{Scheme: sch})
	Expect(err).NotTo(HaveOccurred())

	// Two operator replicas behind the balancer the webhook configuration points at.
	certDir := filepath.Join(workDir, "webhook-certs")
	_, _, err = cp.WriteServingCert(certDir, "kubelock-webhook")
	Expect(err).NotTo(HaveOccurred())
	kc, err := cp.Kubeconfig("controller.kubeconfig", controllerUser, "system:masters")
	Expect(err).NotTo(HaveOccurred())
	var backends []string
	for i := range 2 {
		off := filepath.Join(workDir, fmt.Sprintf("clock-offset-%d", i))
		Expect(os.WriteFile(off, []byte("0s"), 0o644)).To(Succeed())
		m, port := newManager(fmt.Sprintf("manager%d", i), managerBin, kc, certDir, off)
		m.supervise(true)
		managers, offsets = append(managers, m), append(offsets, off)
		backends = append(backends, fmt.Sprintf("127.0.0.1:%d", port))
	}
	lb = newBalancer(backends...)
	DeferCleanup(lb.close)
	Expect(cp.install(ctx, admin, "https://"+lb.addr())).To(Succeed())
	Expect(admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}})).To(Succeed())
	for _, m := range managers {
		Expect(m.start()).To(Succeed())
	}
	DeferCleanup(func() {
		for _, m := range managers {
			m.stop()
		}
	})
	Eventually(leader).WithTimeout(90 * time.Second).ShouldNot(BeNil())

	// The fault proxy, as the lock user, between the clients and the apiserver.
	proxy, err = faultproxy.New(cp.userConfig(clientUser))
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(proxy.Close)

	obs = newObserver()
	DeferCleanup(obs.stop)
	// Every lock write passes the webhook: wait until it answers.
	Eventually(func(g Gomega) {
		k := newLock(ctx, "warmup", 3, 1)
		c := newClient("warmup")
		defer c.exit()
		r := c.do(wire.Command{Cmd: "acquire", Key: k, Wait: 10 * time.Second})
		g.Expect(r.Outcome).To(Equal(history.OK), r.Err)
		g.Expect(c.do(wire.Command{Cmd: "release", Key: k}).Outcome).To(Equal(history.OK))
	}).WithTimeout(2 * time.Minute).Should(Succeed())
}, NodeTimeout(10*time.Minute))

var _ = AfterSuite(func() {
	writeReport()
})

// leader is the manager replica whose log says it holds the leader lease since its last start.
func leader() *process { return leaderOf(managers) }

// leaderOf is the replica of ms whose log says it holds the leader lease since its last start.
func leaderOf(ms []*process) *process {
	for _, m := range ms {
		if !m.running() {
			continue
		}
		b, err := os.ReadFile(m.logPath())
		if err != nil {
			continue
		}
		s := string(b)
		if i := strings.LastIndex(s, "==== start"); i >= 0 {
			s = s[i:]
		}
		if strings.Contains(strings.ToLower(s), "successfully acquired lease") {
			return m
		}
	}
	return nil
}

var lockCount int

// newLock creates a lock with a unique name from prefix and returns its key.
func newLock(ctx context.Context, prefix string, leaseSeconds, handoffSeconds int32) string {
	lockCount++
	key := fmt.Sprintf("%s-%d", prefix, lockCount)
	createLock(ctx, key, leaseSeconds, handoffSeconds)
	obs.watch(key)
	return key
}

func createLock(ctx context.Context, key string, leaseSeconds, handoffSeconds int32) {
	createLockWith(ctx, admin, key, leaseSeconds, handoffSeconds)
}

// createLockWith creates the lock key with c (a control plane's admin).
func createLockWith(ctx context.Context, c client.Client, key string, leaseSeconds, handoffSeconds int32) {
	l := &locksv1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Name: key, Namespace: namespace},
		Spec: locksv1alpha1.DistributedLockSpec{
			LeaseDurationSeconds: leaseSeconds, MaxLeaseDurationSeconds: 300,
			MaxWaiters: ptr.To[int32](64), HandoffTimeoutSeconds: handoffSeconds,
		},
	}
	Eventually(func() error { return client.IgnoreAlreadyExists(c.Create(ctx, l.DeepCopy())) }).Should(Succeed())
}
