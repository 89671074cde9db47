//go:build faults

package faults

import (
	"context"
	"fmt"
	"hash/fnv"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubelock/kubelock/cmd/manager/operator"
	"github.com/kubelock/kubelock/internal/localcluster"
	"github.com/kubelock/kubelock/test/e2e/faults/wire"
	"github.com/kubelock/kubelock/test/faultproxy"
	"github.com/kubelock/kubelock/test/history"
	"github.com/kubelock/kubelock/test/testenv"
)

// laggingAPIServer is the apiserver of the HA control plane whose etcd
// connections pass through delay proxies (haPlane.lag), so that its watch
// cache can be made to lag behind the other's.
const laggingAPIServer = 1

// haPlane is the HA control plane of the "HA control plane" scenarios: three
// etcd members, two kube-apiservers behind HAProxy (the second's etcd
// connections through TCP proxies that can delay what etcd sends it), two
// operator replicas and the lock clients connected through HAProxy, each
// connection to whichever apiserver HAProxy picks, and an observer of its own.
type haPlane struct {
	*controlPlane
	admin      client.Client
	etcdLag    []*faultproxy.TCP
	managers   []*process
	webhook    *balancer
	obs        *observer
	clientConf string // the lock user's kubeconfig, through HAProxy
}

// startHA starts the HA control plane in dir.
func startHA(ctx context.Context, dir string) (*haPlane, error) {
	ha := &haPlane{}
	var ports []localcluster.EtcdPorts
	var lagged []string
	for range 3 {
		p := localcluster.EtcdPorts{Client: freePort(), Peer: freePort()}
		lag, err := faultproxy.NewTCP(fmt.Sprintf("127.0.0.1:%d", p.Client))
		if err != nil {
			return nil, err
		}
		ports, ha.etcdLag, lagged = append(ports, p), append(ha.etcdLag, lag), append(lagged, "http://"+lag.Addr())
	}
	each := make([][]string, laggingAPIServer+1)
	each[laggingAPIServer] = []string{"--etcd-servers=" + strings.Join(lagged, ",")}
	c, err := localcluster.Start(ctx, localcluster.Options{
		Name: "kubelock-faults-ha", Dir: dir, LogDir: dir, AssetsDir: testenv.AssetsDir(),
		Admin:       "kubelock-faults-admin",
		EtcdMembers: 3, EtcdPorts: ports,
		APIServers: 2, Balancer: true,
		APIServerArgs:     []string{"--advertise-address=127.0.0.1"},
		APIServerEachArgs: each,
		StartTimeout:      3 * time.Minute,
	})
	if err != nil {
		ha.closeLag()
		return nil, err
	}
	ha.controlPlane = &controlPlane{Cluster: c, admin: c.AdminConfig()}
	ha.controlPlane.admin.QPS = -1
	sch, err := operator.Scheme()
	if err != nil {
		return ha, err
	}
	if ha.admin, err = client.New(ha.controlPlane.admin, client.Options{Scheme: sch}); err != nil {
		return ha, err
	}
	if ha.clientConf, err = c.Kubeconfig("client.kubeconfig", clientUser); err != nil {
		return ha, err
	}
	err = ha.startOperator(ctx, dir)
	return ha, err
}

// startOperator installs kubelock and starts two operator replicas connected
// through HAProxy, the webhook's balancer and the observer.
func (ha *haPlane) startOperator(ctx context.Context, dir string) error {
	certDir := filepath.Join(dir, "webhook-certs")
	if _, _, err := ha.WriteServingCert(certDir, "kubelock-webhook"); err != nil {
		return err
	}
	kc, err := ha.Kubeconfig("controller.kubeconfig", controllerUser, "system:masters")
	if err != nil {
		return err
	}
	var backends []string
	for i := range 2 {
		off := filepath.Join(dir, fmt.Sprintf("clock-offset-%d", i))
		if err := os.WriteFile(off, []byte("0s"), 0o644); err != nil {
			return err
		}
		m, port := newManager(fmt.Sprintf("ha-manager%d", i), managerBin, kc, certDir, off)
		m.supervise(true)
		ha.managers = append(ha.managers, m)
		backends = append(backends, fmt.Sprintf("127.0.0.1:%d", port))
	}
	ha.webhook = newBalancer(backends...)
	if err := ha.install(ctx, ha.admin, "https://"+ha.webhook.addr()); err != nil {
		return err
	}
	if err := ha.admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		return err
	}
	for _, m := range ha.managers {
		if err := m.start(); err != nil {
			return err
		}
	}
	// Through HAProxy as the clients, and each apiserver directly: when one
	// is stopped, the connection HAProxy gave the observer may be on it.
	var direct []client.Client
	for _, a := range ha.APIServers {
		cfg := rest.CopyConfig(ha.controlPlane.admin)
		cfg.Host = a.URL
		c, err := client.New(cfg, client.Options{Scheme: ha.admin.Scheme()})
		if err != nil {
			return err
		}
		direct = append(direct, c)
	}
	ha.obs = newObserverOf("ha-observer", ha.admin, direct...)
	return nil
}

// waitServing waits until an operator replica leads and a lock write
// passes: every lock write passes the webhook.
func (ha *haPlane) waitServing(ctx context.Context) {
	ha.waitLeader()
	Eventually(func(g Gomega) {
		k := ha.newLock(ctx, "ha-warmup", 3, 1)
		defer ha.unwatch(k)
		c := ha.newClient("ha-warmup")
		defer c.exit()
		r := c.do(wire.Command{Cmd: "acquire", Key: k, Wait: 10 * time.Second})
		g.Expect(r.Outcome).To(Equal(history.OK), r.Err)
		g.Expect(c.do(wire.Command{Cmd: "release", Key: k}).Outcome).To(Equal(history.OK))
	}).WithTimeout(2 * time.Minute).Should(Succeed())
}

// stop stops everything startHA started.
func (ha *haPlane) stop() {
	if ha.obs != nil {
		ha.obs.stop()
	}
	for _, m := range ha.managers {
		m.stop()
	}
	if ha.webhook != nil {
		ha.webhook.close()
	}
	if ha.controlPlane != nil {
		_ = ha.Stop()
	}
	ha.closeLag()
}

func (ha *haPlane) closeLag() {
	for _, l := range ha.etcdLag {
		l.Close()
	}
}

// setLag delays what etcd sends the lagging apiserver by d (0: none).
func (ha *haPlane) setLag(d time.Duration) {
	for _, l := range ha.etcdLag {
		l.SetDelay(d)
	}
}

// newClient starts a lock client connected through HAProxy.
func (ha *haPlane) newClient(name string) *lockClient {
	return newClientVia(name, "--kubeconfig="+ha.clientConf)
}

// newLock creates a lock of the HA control plane with a unique name from
// prefix, watched by its observer, and returns its key.
func (ha *haPlane) newLock(ctx context.Context, prefix string, leaseSeconds, handoffSeconds int32) string {
	lockCount++
	key := fmt.Sprintf("%s-%d", prefix, lockCount)
	createLockWith(ctx, ha.admin, key, leaseSeconds, handoffSeconds)
	ha.obs.watch(key)
	return key
}

func (ha *haPlane) unwatch(keys ...string) {
	for _, k := range keys {
		ha.obs.unwatch(k)
	}
}

// waitLeader waits for an operator replica to lead and returns it.
func (ha *haPlane) waitLeader() *process {
	var l *process
	Eventually(func() *process { l = leaderOf(ha.managers); return l }).WithTimeout(2 * time.Minute).ShouldNot(BeNil())
	return l
}

// apiserver is the apiserver named name.
func (ha *haPlane) apiserver(name string) *localcluster.APIServer {
	for _, a := range ha.APIServers {
		if a.Name == name {
			return a
		}
	}
	Fail("no apiserver " + name)
	return nil
}

// waitBack waits until a is ready again and HAProxy sends it connections.
func (ha *haPlane) waitBack(ctx context.Context, a *localcluster.APIServer) {
	Expect(a.WaitReady(ctx)).To(Succeed())
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	Expect(ha.Balancer.WaitUp(wctx, a.Name)).To(Succeed())
}

// connections counts the connections process p has through HAProxy, by the
// apiserver each goes to: its sockets (/proc/<pid>/fd) whose local port
// HAProxy's sessions name.
func (ha *haPlane) connections(p *process) map[string]int {
	c := p.current()
	Expect(c).NotTo(BeNil(), "%s is not running", p.name)
	ports, err := localPorts(c.Pid(), ha.Balancer.Port)
	Expect(err).NotTo(HaveOccurred())
	sessions, err := ha.Balancer.Sessions()
	Expect(err).NotTo(HaveOccurred())
	out := map[string]int{}
	for _, port := range ports {
		if srv, ok := sessions[port]; ok {
			out[srv]++
		}
	}
	return out
}

// busiest is the apiserver carrying most of p's connections.
func (ha *haPlane) busiest(p *process) string {
	best, n := "", 0
	for srv, k := range ha.connections(p) {
		if k > n || (k == n && srv < best) {
			best, n = srv, k
		}
	}
	Expect(best).NotTo(BeEmpty(), "%s has no connection through HAProxy", p.name)
	return best
}

// clientsOn are the clients of cs with a connection to apiserver srv.
func (ha *haPlane) clientsOn(srv string, cs []*lockClient) []*lockClient {
	var on []*lockClient
	for _, c := range cs {
		if ha.connections(c.process)[srv] > 0 {
			on = append(on, c)
		}
	}
	return on
}

// localPorts are the local ports of pid's TCP connections to 127.0.0.1:port,
// from its sockets' inodes and its network namespace's /proc/net/tcp.
func localPorts(pid, port int) ([]int, error) {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return nil, err
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if inode, ok := strings.CutPrefix(link, "socket:["); ok && err == nil {
			inodes[strings.TrimSuffix(inode, "]")] = true
		}
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/tcp", pid))
	if err != nil {
		return nil, err
	}
	remote := fmt.Sprintf("0100007F:%04X", port)
	var out []int
	// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 10 || f[2] != remote || !inodes[f[9]] {
			continue
		}
		_, hexPort, _ := strings.Cut(f[1], ":")
		p, err := strconv.ParseInt(hexPort, 16, 32)
		if err != nil {
			return nil, err
		}
		out = append(out, int(p))
	}
	return out, nil
}

// names lists the clients' names.
func names(cs []*lockClient) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.name)
	}
	return out
}

// loopClients starts n clients named prefix-c0... looping on keys through
// HAProxy.
func (ha *haPlane) loopClients(prefix string, n int, keys []string) []*lockClient {
	var cs []*lockClient
	for i := range n {
		cs = append(cs, ha.newClient(fmt.Sprintf("%s-c%d", prefix, i)))
	}
	loop(cs, keys, 5*time.Second, 0)
	return cs
}

// loop has each of cs loop on keys (two fenced writes per holding, every
// apart), each acquire waiting up to wait.
func loop(cs []*lockClient, keys []string, wait, every time.Duration) {
	for _, c := range cs {
		h := fnv.New64a()
		_, _ = h.Write([]byte(c.name))
		c.do(wire.Command{Cmd: "loop", Keys: keys, N: 2, Wait: wait, Every: every, Seed: h.Sum64()})
	}
}

// stopClients stops the clients' loops, makes them exit and returns the
// operations they ran.
func stopClients(cs []*lockClient) int64 {
	var ops int64
	for _, c := range cs {
		ops += c.do(wire.Command{Cmd: "stop"}).Ops
		c.exit()
	}
	return ops
}

// firstOKOf is the return time of the first acquisition by any of cs after
// t, 0 if none.
func firstOKOf(cs []*lockClient, prefix string, t int64) int64 {
	return firstOKAfter(eventsOf(cs, prefix), t)
}

// splitProxy sends a client's reads (GET: gets, lists, watches) to one
// apiserver and its writes to another, each with the upstream's
// credentials, as a client behind a balancer can read from a lagging
// apiserver's cache while its writes reach an up-to-date one. It counts the
// writes and the conflicts (409) they met.
type splitProxy struct {
	srv               *httptest.Server
	writes, conflicts atomic.Int64
}

func newSplitProxy(reads, writes *rest.Config) *splitProxy {
	sp := &splitProxy{}
	rp, wp := reverseProxy(reads, nil), reverseProxy(writes, func(resp *http.Response) error {
		sp.writes.Add(1)
		if resp.StatusCode == http.StatusConflict {
			sp.conflicts.Add(1)
		}
		return nil
	})
	sp.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			rp.ServeHTTP(w, r)
			return
		}
		wp.ServeHTTP(w, r)
	}))
	return sp
}

func (sp *splitProxy) url() string { return sp.srv.URL }

func (sp *splitProxy) close() {
	sp.srv.CloseClientConnections()
	sp.srv.Close()
}

// reverseProxy forwards to cfg's apiserver with its credentials, streaming
// watches, each response through modify when set.
func reverseProxy(cfg *rest.Config, modify func(*http.Response) error) *httputil.ReverseProxy {
	rt, err := rest.TransportFor(cfg)
	must(err)
	target, err := url.Parse(cfg.Host)
	must(err)
	return &httputil.ReverseProxy{
		Rewrite:        func(r *httputil.ProxyRequest) { r.SetURL(target) },
		Transport:      rt,
		FlushInterval:  -1,
		ModifyResponse: modify,
		// A client's cancelled watch is no error of the proxy's.
		ErrorLog: log.New(io.Discard, "", 0),
	}
}

// at is cfg addressed to url.
func at(cfg *rest.Config, url string) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.Host = url
	return c
}

// watchLag is how much later the lagging apiserver's watch delivers a write
// than the other's: a ConfigMap created through the other, watched on both.
func (ha *haPlane) watchLag(ctx context.Context, name string) time.Duration {
	sch, err := operator.Scheme()
	Expect(err).NotTo(HaveOccurred())
	seen := make([]chan time.Time, len(ha.APIServers))
	for i, a := range ha.APIServers {
		wc, err := client.NewWithWatch(at(ha.controlPlane.admin, a.URL), client.Options{Scheme: sch})
		Expect(err).NotTo(HaveOccurred())
		w, err := wc.Watch(ctx, &corev1.ConfigMapList{}, client.InNamespace(namespace))
		Expect(err).NotTo(HaveOccurred())
		seen[i] = make(chan time.Time, 1)
		go func() {
			defer w.Stop()
			for ev := range w.ResultChan() {
				if cm, ok := ev.Object.(*corev1.ConfigMap); ok && cm.Name == name {
					seen[i] <- time.Now()
					return
				}
			}
		}()
	}
	wc, err := client.New(at(ha.controlPlane.admin, ha.APIServers[1-laggingAPIServer].URL), client.Options{Scheme: sch})
	Expect(err).NotTo(HaveOccurred())
	Expect(wc.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}})).To(Succeed())
	var ts []time.Time
	for _, ch := range seen {
		select {
		case t := <-ch:
			ts = append(ts, t)
		case <-time.After(30 * time.Second):
			Fail("a watch never saw the ConfigMap " + name)
		}
	}
	return ts[laggingAPIServer].Sub(ts[1-laggingAPIServer])
}
