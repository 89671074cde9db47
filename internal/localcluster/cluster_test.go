package localcluster_test

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kubelock/kubelock/internal/localcluster"
)

// TestCluster runs what the fault suite and its HA scenarios need: three
// etcd members, two apiservers with the aggregation layer behind HAProxy and
// kube-controller-manager; each part stops and starts on its own.
func TestCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()
	c, err := localcluster.Start(ctx, localcluster.Options{
		Name: "localcluster-test", Dir: dir, AssetsDir: localcluster.AssetsDir(filepath.Join("..", "..")),
		EtcdMembers: 3, EtcdArgs: []string{"--max-request-bytes=131072"},
		APIServers: 2, Aggregation: true, Balancer: true, StartControllerManager: true,
		StartTimeout: 2 * time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Stop() }()
	if n, a := len(c.Etcd.Members), len(c.APIServers); n != 3 || a != 2 {
		t.Fatalf("%d etcd members and %d apiservers, want 3 and 2", n, a)
	}
	if c.URL() != c.Balancer.URL || c.AdminConfig().Host != c.Balancer.URL {
		t.Fatalf("the cluster's URL %s and the admin's %s, want the balancer's %s", c.URL(), c.AdminConfig().Host, c.Balancer.URL)
	}
	for _, comp := range c.Components() {
		if comp.Running() == nil {
			t.Errorf("%s is not running", comp.Name)
		}
	}

	t.Run("the apiservers share one etcd", func(t *testing.T) {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shared"}}
		if _, err := clientset(t, c, 0).CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := clientset(t, c, 1).CoreV1().Namespaces().Get(ctx, "shared", metav1.GetOptions{}); err != nil {
			t.Errorf("the second apiserver does not see the first's write: %v", err)
		}
	})

	t.Run("etcd takes its extra flags", func(t *testing.T) {
		cli, err := clientv3.New(clientv3.Config{Endpoints: c.Etcd.Endpoints(), DialTimeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = cli.Close() }()
		if _, err := cli.Put(ctx, "/big", strings.Repeat("x", 200<<10)); err == nil || !strings.Contains(err.Error(), "too large") {
			t.Errorf("a 200 KiB put with --max-request-bytes=131072: %v, want request too large", err)
		}
	})

	t.Run("a member stopped and started again", func(t *testing.T) {
		m := c.Etcd.Members[2]
		if err := m.Stop(); err != nil {
			t.Fatal(err)
		}
		createNamespace(ctx, t, c, "two-members")
		if err := m.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if err := c.APIServer().WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
		createNamespace(ctx, t, c, "three-members")
	})

	t.Run("an apiserver killed and started again", func(t *testing.T) {
		a := c.APIServers[1]
		a.Kill()
		if a.Running() != nil {
			t.Fatal("killed, and still running")
		}
		if err := a.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := clientset(t, c, 1).CoreV1().Namespaces().Get(ctx, "three-members", metav1.GetOptions{}); err != nil {
			t.Error(err)
		}
		select {
		case err := <-a.Failed():
			t.Errorf("a kill asked for is reported as a failure: %v", err)
		default:
		}
	})

	t.Run("the balancer spreads connections over the apiservers and leaves out a killed one", func(t *testing.T) {
		for _, a := range c.APIServers { // the one killed above comes back after two checks
			if err := c.Balancer.WaitUp(ctx, a.Name); err != nil {
				t.Fatal(err)
			}
		}
		seen := map[string]bool{}
		for range 4 {
			_, srv := balancedGet(ctx, t, c, "/version")
			seen[srv] = true
		}
		if !seen["kube-apiserver0"] || !seen["kube-apiserver1"] {
			t.Errorf("4 connections went to %v, want both apiservers", seen)
		}
		a := c.APIServers[0]
		a.Kill()
		for range 4 {
			if code, srv := balancedGet(ctx, t, c, "/readyz"); code != http.StatusOK || srv != "kube-apiserver1" {
				t.Errorf("with kube-apiserver0 killed: %d from %s, want 200 from kube-apiserver1", code, srv)
			}
		}
		if err := a.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if err := c.Balancer.WaitUp(ctx, a.Name); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("the front proxy's headers name the user", func(t *testing.T) {
		front := filepath.Join(dir, "pki", "front-proxy")
		cfg := &rest.Config{Host: c.URL(), TLSClientConfig: rest.TLSClientConfig{CAData: c.CA.PEM,
			CertFile: filepath.Join(front, "proxy-client.crt"), KeyFile: filepath.Join(front, "proxy-client.key")}}
		cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
			return roundTripper(func(r *http.Request) (*http.Response, error) {
				r = r.Clone(r.Context())
				r.Header.Set("X-Remote-User", "alice")
				r.Header.Set("X-Remote-Group", "system:authenticated")
				return rt.RoundTrip(r)
			})
		}
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		review, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := review.Status.UserInfo.Username; got != "alice" {
			t.Errorf("authenticated as %q, want alice", got)
		}
	})

	t.Run("an exit nobody asked for is a failure", func(t *testing.T) {
		kcm := c.ControllerManager
		if err := kcm.Running().Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-kcm.Failed():
			if !strings.Contains(err.Error(), "kube-controller-manager exited") {
				t.Errorf("failure %v does not name the component", err)
			}
		case <-time.After(time.Minute):
			t.Fatal("no failure reported")
		}
		if err := kcm.Stop(); err != nil {
			t.Fatal(err)
		}
		if err := kcm.Start(ctx); err != nil {
			t.Fatal(err)
		}
	})

	pids := map[string]int{}
	for _, comp := range c.Components() {
		pids[comp.Name] = comp.Running().Pid()
	}
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	for name, pid := range pids {
		if err := syscall.Kill(pid, 0); err == nil {
			t.Errorf("%s (pid %d) still runs after Stop", name, pid)
		}
	}
}

// TestFreshUnlessPersist checks that a fresh start removes only etcd's data
// and the certificates, and that Persist keeps them.
func TestFreshUnlessPersist(t *testing.T) {
	dir := t.TempDir()
	files := []string{"etcd/member", "pki/marker", "logs/operator.log", "kubeconfig"}
	for _, p := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// Without binaries the start fails after the folder was prepared.
	o := localcluster.Options{Dir: dir, AssetsDir: t.TempDir(), Persist: true, EtcdPorts: []localcluster.EtcdPorts{{Client: 1, Peer: 2}}}
	if _, err := localcluster.Start(context.Background(), o); err == nil {
		t.Fatal("started without binaries")
	}
	for _, p := range files {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			t.Errorf("Persist removed %s: %v", p, err)
		}
	}
	o.Persist = false
	if _, err := localcluster.Start(context.Background(), o); err == nil {
		t.Fatal("started without binaries")
	}
	for p, kept := range map[string]bool{"etcd/member": false, "pki/marker": false, "logs/operator.log": true, "kubeconfig": true} {
		_, err := os.Stat(filepath.Join(dir, p))
		if kept && err != nil {
			t.Errorf("%s was removed: %v", p, err)
		}
		if !kept && err == nil {
			t.Errorf("%s was kept", p)
		}
	}
}

func clientset(t *testing.T, c *localcluster.Cluster, i int) *kubernetes.Clientset {
	t.Helper()
	cfg := c.AdminConfig()
	cfg.Host = c.APIServers[i].URL
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// balancedGet GETs path through the balancer as the admin on a connection
// of its own and returns the status and the apiserver that answered, by
// HAProxy's account of the connection.
func balancedGet(ctx context.Context, t *testing.T, c *localcluster.Cluster, path string) (int, string) {
	t.Helper()
	tlsCfg, err := rest.TLSConfigFor(c.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{TLSClientConfig: tlsCfg}
	defer tr.CloseIdleConnections()
	var local int
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err == nil {
			local = conn.LocalAddr().(*net.TCPAddr).Port //nolint:errcheck // a TCP connection's address
		}
		return conn, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.URL()+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	sessions, err := c.Balancer.Sessions()
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, sessions[local]
}

func createNamespace(ctx context.Context, t *testing.T, c *localcluster.Cluster, name string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := clientset(t, c, 0).CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating namespace %s: %v", name, err)
	}
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
