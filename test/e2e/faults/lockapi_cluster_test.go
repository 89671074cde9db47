//go:build faults

package faults

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kubelock/kubelock/internal/localcluster"
	"github.com/kubelock/kubelock/test/e2e/faults/wire"
	"github.com/kubelock/kubelock/test/faultproxy"
	"github.com/kubelock/kubelock/test/history"
	"github.com/kubelock/kubelock/test/lockapi"
	"github.com/kubelock/kubelock/test/testenv"
)

// lockBackend is the lock apiserver backend's control plane: kube-apiserver
// with the aggregation layer (requests spread over the APIService's ready
// endpoints, --enable-aggregator-routing), two kubelock-apiserver replicas
// behind one Service, both on one three-member lock etcd, and the
// readiness probe that takes a replica out of the Service and puts it back.
type lockBackend struct {
	env      *testenv.Env
	etcd     *localcluster.Etcd
	replicas []*lockapi.Server
	probe    *readinessProbe
}

// startLockBackend starts the lock apiserver backend with the operator's two
// replicas and the fault proxy, and makes them the suite's world (cp, admin,
// managers, proxy, obs) until the calling container ends, so that the
// scenarios' helpers (newClient, newLock, getLock, leader, check) work on it.
// The suite's own control plane keeps running, untouched.
func startLockBackend(ctx context.Context) *lockBackend {
	dir := filepath.Join(workDir, "lockapi")
	Expect(os.MkdirAll(dir, 0o755)).To(Succeed())
	b := &lockBackend{}
	var err error
	b.env, err = lockapi.ControlPlane(func(e *envtest.Environment) { e.ControlPlaneStartTimeout = 3 * time.Minute })
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(b.env.Stop)

	b.etcd, err = localcluster.StartEtcd(ctx, localcluster.Options{
		Name: "kubelock-faults-lock-etcd", Dir: filepath.Join(dir, "etcd"), LogDir: dir, AssetsDir: testenv.AssetsDir(),
		EtcdMembers: 3, StartTimeout: 3 * time.Minute,
	})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(b.etcd.Stop)
	bin, err := lockapi.Build(ctx, dir)
	Expect(err).NotTo(HaveOccurred())
	for i := range 2 {
		// One Name (the Service's, which their certificates are for), a folder each.
		rdir := filepath.Join(dir, fmt.Sprintf("replica%d", i))
		Expect(os.MkdirAll(rdir, 0o755)).To(Succeed())
		r, err := lockapi.Start(ctx, b.env, bin, rdir, lockapi.Options{
			Store: b.etcd, Args: []string{"--controller-users=" + controllerUser},
		})
		if r != nil {
			DeferCleanup(r.Stop)
		}
		Expect(err).NotTo(HaveOccurred())
		b.replicas = append(b.replicas, r)
	}
	Expect(lockapi.Register(ctx, b.env, b.replicas...)).To(Succeed())
	b.probe = newReadinessProbe(b.env, b.replicas)
	DeferCleanup(b.probe.stop)

	clientCfg, err := b.env.UserConfig(ctx, clientUser)
	Expect(err).NotTo(HaveOccurred())
	Expect(b.install(ctx)).To(Succeed())
	b.becomeTheWorld(ctx, clientCfg)
	return b
}

// install creates the scenarios' namespace and the operator's election
// identity (FAULTS_ELECTION=kubelock campaigns as it).
func (b *lockBackend) install(ctx context.Context) error {
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: operatorNS, Name: electionSA}},
		&rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: operatorNS, Name: electionSA},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: testenv.LockUserRole},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: operatorNS, Name: electionSA}},
		},
	} {
		if err := b.env.Client.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating %T %s: %w", o, o.GetName(), err)
		}
	}
	return nil
}

// becomeTheWorld starts the operator's two replicas, the fault proxy (as
// the lock user, clientCfg) and an observer on this control plane, puts
// them in the suite's place and puts the suite's back when the container ends.
func (b *lockBackend) becomeTheWorld(ctx context.Context, clientCfg *rest.Config) {
	saved := struct {
		cp       *controlPlane
		admin    client.Client
		managers []*process
		offsets  []string
		proxy    *faultproxy.Proxy
		obs      *observer
	}{cp, admin, managers, offsets, proxy, obs}
	DeferCleanup(func() {
		cp, admin, managers, offsets, proxy, obs = saved.cp, saved.admin, saved.managers, saved.offsets, saved.proxy, saved.obs
	})
	cp, admin = &controlPlane{Cluster: b.env.Cluster, admin: b.env.Config}, b.env.Client

	dir := filepath.Join(workDir, "lockapi")
	certDir := filepath.Join(dir, "webhook-certs")
	_, _, err := cp.WriteServingCert(certDir, "kubelock-webhook")
	Expect(err).NotTo(HaveOccurred())
	kc, err := cp.Kubeconfig("lockapi-controller.kubeconfig", controllerUser, "system:masters")
	Expect(err).NotTo(HaveOccurred())
	managers, offsets = nil, nil
	for i := range 2 {
		off := filepath.Join(dir, fmt.Sprintf("clock-offset-%d", i))
		Expect(os.WriteFile(off, []byte("0s"), 0o644)).To(Succeed())
		m, _ := newManager(fmt.Sprintf("lockapi-manager%d", i), managerBin, kc, certDir, off)
		m.supervise(true)
		Expect(m.start()).To(Succeed())
		DeferCleanup(m.stop)
		managers, offsets = append(managers, m), append(offsets, off)
	}
	waitLeader()

	proxy, err = faultproxy.New(clientCfg)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(proxy.Close)
	obs = newObserverOf("lockapi-observer", admin)
	DeferCleanup(obs.stop)
	Eventually(func(g Gomega) {
		k := newLock(ctx, "lockapi-warmup", 3, 1)
		c := newClient(fmt.Sprintf("lockapi-warmup-%d", lockCount))
		defer c.exit()
		r := c.do(wire.Command{Cmd: "acquire", Key: k, Wait: 10 * time.Second})
		g.Expect(r.Outcome).To(Equal(history.OK), r.Err)
		g.Expect(c.do(wire.Command{Cmd: "release", Key: k}).Outcome).To(Equal(history.OK))
	}).WithTimeout(2 * time.Minute).Should(Succeed())
}

// ready waits until every replica's /readyz passes, its lock etcd included.
func (b *lockBackend) ready(ctx context.Context) error {
	for _, r := range b.replicas {
		if err := r.APIServer.WaitFor(ctx, "ready", 2*time.Minute, r.Ready); err != nil {
			return err
		}
	}
	return nil
}

// lockWrites counts the DistributedLock PUTs (main resource and status)
// replica r has served, from its /metrics.
func (b *lockBackend) lockWrites(ctx context.Context, r *lockapi.Server) int {
	hc, err := rest.HTTPClientFor(r.Direct(b.env.Config))
	Expect(err).NotTo(HaveOccurred())
	defer hc.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.URL()+"/metrics", nil)
	Expect(err).NotTo(HaveOccurred())
	resp, err := hc.Do(req)
	Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	Expect(resp.StatusCode).To(Equal(http.StatusOK))
	n := 0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "apiserver_request_total{") || !strings.Contains(line, `resource="distributedlocks"`) || !strings.Contains(line, `verb="PUT"`) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		Expect(err).NotTo(HaveOccurred())
		n += int(v)
	}
	Expect(sc.Err()).NotTo(HaveOccurred())
	return n
}

// readinessProbe plays each replica's readiness probe and the EndpointSlice
// controller, as a Deployment's pods have them: /readyz (its etcd included)
// every probePeriod with a timeout of as much; after probeFailures failures in
// a row the replica's endpoint is marked not ready (kube-apiserver sends it
// nothing new), after a success ready again. Its timings are shorter than a
// kubelet's defaults so that the scenarios stay short.
type readinessProbe struct {
	env      *testenv.Env
	replicas []*lockapi.Server
	cancel   context.CancelFunc
	wg       sync.WaitGroup

	mu sync.Mutex
	// ready is each replica's endpoint as last written; changed, when each
	// was last marked ready or not (CLOCK_MONOTONIC).
	ready   []bool
	changed []int64
}

const (
	probePeriod   = 500 * time.Millisecond
	probeFailures = 2
)

func newReadinessProbe(env *testenv.Env, replicas []*lockapi.Server) *readinessProbe {
	ctx, cancel := context.WithCancel(context.Background())
	p := &readinessProbe{env: env, replicas: replicas, cancel: cancel, ready: make([]bool, len(replicas)), changed: make([]int64, len(replicas))}
	for i := range replicas {
		p.ready[i] = true
		p.wg.Add(1)
		go p.run(ctx, i)
	}
	return p
}

func (p *readinessProbe) stop() { p.cancel(); p.wg.Wait() }

func (p *readinessProbe) run(ctx context.Context, i int) {
	defer p.wg.Done()
	r := p.replicas[i]
	failures := 0
	t := time.NewTicker(probePeriod)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, probePeriod)
		err := r.Ready(pctx)
		cancel()
		if err != nil {
			failures++
		} else {
			failures = 0
		}
		want := failures < probeFailures
		if want == p.isReady(i) {
			continue
		}
		// Written through kube-apiserver; while it is down, tried again at the next probe.
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if r.SetReady(wctx, p.env, want) == nil {
			p.mu.Lock()
			p.ready[i], p.changed[i] = want, history.Mono()
			p.mu.Unlock()
		}
		cancel()
	}
}

// isReady reports whether replica i's endpoint is marked ready.
func (p *readinessProbe) isReady(i int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ready[i]
}

// since is when replica i's endpoint was last marked ready or not.
func (p *readinessProbe) since(i int) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.changed[i]
}
