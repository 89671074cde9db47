// Package node runs a real node next to a local cluster (root only):
// kube-scheduler, containerd, kubelet and kube-proxy, with pods on a CNI
// bridge and images built from a Go module and imported, never pulled. The
// host changes it makes are claimed and restored by package host; one node
// runs per machine.
package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/kubelock/kubelock/internal/localcluster"
	"github.com/kubelock/kubelock/internal/localcluster/node/host"
	"github.com/kubelock/kubelock/internal/proc"
)

const (
	// PauseImage is the pod sandbox's image, built from package pause.
	PauseImage   = "kubelock.local/pause:latest"
	pausePackage = "./internal/localcluster/node/pause"

	podCIDR    = "10.244.0.0/24"
	bridgeName = "kubelock0"
	// The kubelet's and kube-proxy's ports are fixed: one node per machine.
	kubeletPort    = 10250
	kubeletHealthz = "http://127.0.0.1:10248/healthz"
)

// DefaultBinDir is where `make node` builds containerd, runc and the CNI plugins.
func DefaultBinDir() string { return filepath.Join("bin", "node") }

// Options say how to run the node.
type Options struct {
	// Dir holds the node's configuration and state; restoring the host
	// removes it.
	Dir string
	// BinDir holds containerd, ctr, the runc shim, runc and cni/ (`make node`).
	BinDir string
	// AssetsDir holds kube-scheduler, kubelet and kube-proxy.
	AssetsDir string
	// Module is the folder of the Go module the images are built from.
	Module string
	// Images are built from Module and imported into containerd, with PauseImage.
	Images []Image
	// StartTimeout bounds each start-up stage.
	StartTimeout time.Duration
	// Progress, when set, hears a line per stage.
	Progress func(format string, args ...any)
}

// Image is an image of static binaries built from Options.Module: each of
// Packages (main packages, as go build names them) becomes /<its last path
// element>; the first is the entrypoint. Binaries are static executables
// built elsewhere (etcd, by hack/build-node.sh), each /<its base name>, after
// the packages'.
type Image struct {
	Ref      string
	Packages []string
	Binaries []string
}

// Node is a node; its components exist once Start has run.
type Node struct {
	// IP is its address: where the apiserver listens for its pods, and its name.
	IP string
	// Scheduler, Containerd, Kubelet and KubeProxy are its processes.
	Scheduler, Containerd, Kubelet, KubeProxy *localcluster.Component

	o       Options
	cluster *localcluster.Cluster
	archive string // the images, for containerd's import
}

// New checks that the node can run here, in one line when not: root, its
// binaries, iptables, and an address that is not loopback.
func New(o Options) (*Node, error) {
	if o.Progress == nil {
		o.Progress = func(string, ...any) {}
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = localcluster.DefaultStartTimeout
	}
	n := &Node{o: o}
	if err := n.check(); err != nil {
		return nil, err
	}
	var err error
	n.IP, err = primaryIPv4()
	return n, err
}

// binaries are what the node needs, by folder.
func (n *Node) binaries() map[string][]string {
	return map[string][]string{
		n.o.AssetsDir: {"kube-scheduler", "kubelet", "kube-proxy"},
		n.o.BinDir:    {"containerd", "containerd-shim-runc-v2", "ctr", "runc", "cni/bridge", "cni/host-local", "cni/loopback", "cni/portmap"},
	}
}

func (n *Node) check() error {
	if os.Geteuid() != 0 {
		return errors.New("--node runs kubelet, containerd and kube-proxy, which need root: run it as root (sudo), or drop --node for the process-only environment")
	}
	for dir, bins := range n.binaries() {
		for _, b := range bins {
			p := filepath.Join(dir, b)
			if st, err := os.Stat(p); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
				return fmt.Errorf("no %s binary at %s: build the node with `make node`", b, p)
			}
		}
	}
	if _, err := exec.LookPath("iptables"); err != nil {
		return errors.New("--node needs iptables (kube-proxy): apt-get install iptables conntrack")
	}
	return nil
}

// primaryIPv4 is the address this machine's default route leaves from: pods
// reach the apiserver there, and it names the node (it resolves everywhere,
// while the host name may resolve to a loopback address).
func primaryIPv4() (string, error) {
	conn, err := net.Dial("udp4", "192.0.2.255:9") // no packet is sent: this only picks the route
	if err != nil {
		return "", fmt.Errorf("--node needs a non-loopback IPv4 address with a route: %w", err)
	}
	defer func() { _ = conn.Close() }()
	ip := conn.LocalAddr().(*net.UDPAddr).IP //nolint:errcheck // a UDP connection's address
	if ip.IsLoopback() {
		return "", errors.New("--node needs a non-loopback IPv4 address; this machine has only loopback")
	}
	return ip.String(), nil
}

// Host is what the node puts on the machine, for host.Claim.
func (n *Node) Host() host.Node {
	// The shims' /proc/<pid>/exe is the real path.
	abs := func(p string) string {
		a, _ := filepath.Abs(p)
		if r, err := filepath.EvalSymlinks(a); err == nil {
			return r
		}
		return a
	}
	return host.Node{
		Dir:        n.o.Dir,
		MountRoots: []string{n.o.Dir, "/var/lib/kubelet", "/run/containerd", "/run/netns"},
		Shim:       abs(filepath.Join(n.o.BinDir, "containerd-shim-runc-v2")),
		KubeProxy:  abs(filepath.Join(n.o.AssetsDir, "kube-proxy")),
		Bridge:     bridgeName,
	}
}

// Start builds and writes the images, starts the node's processes against c
// (started with Options.NodeIP = IP) and returns once the node is Ready.
// Stop the node, then restore the host, even when Start fails.
func (n *Node) Start(ctx context.Context, c *localcluster.Cluster) error {
	n.cluster = c
	if err := n.buildImages(ctx); err != nil {
		return err
	}
	started := time.Now()
	for _, step := range []func(context.Context) error{n.startScheduler, n.startContainerd, n.startKubelet, n.startKubeProxy, n.waitReady} {
		if err := step(ctx); err != nil {
			return err
		}
	}
	n.o.Progress("node %s Ready after %s", n.IP, time.Since(started).Round(10*time.Millisecond))
	return nil
}

// Components are the node's processes that were started, in start order.
func (n *Node) Components() []*localcluster.Component {
	var cs []*localcluster.Component
	for _, c := range []*localcluster.Component{n.Scheduler, n.Containerd, n.Kubelet, n.KubeProxy} {
		if c != nil {
			cs = append(cs, c)
		}
	}
	return cs
}

// Stop stops the node's processes in reverse order, then kills its
// containers, which would otherwise hold the control plane's watches.
func (n *Node) Stop() error {
	err := localcluster.StopAll(n.Components())
	host.KillContainers(n.Host().Shim)
	return err
}

// RestartKubelet stops the kubelet and starts it again. The pods' containers
// run on under containerd meanwhile, and the restarted kubelet takes them over.
func (n *Node) RestartKubelet(ctx context.Context) error {
	if n.Kubelet == nil {
		return errors.New("no kubelet to restart")
	}
	started := time.Now()
	if err := n.Kubelet.Stop(); err != nil {
		return err
	}
	n.o.Progress("kubelet stopped; starting it again")
	if err := n.start(ctx, n.Kubelet); err != nil {
		return err
	}
	n.o.Progress("kubelet restarted in %s", time.Since(started).Round(10*time.Millisecond))
	return nil
}

// dir is a path in the node's folder.
func (n *Node) dir(parts ...string) string {
	return filepath.Join(append([]string{n.o.Dir}, parts...)...)
}

// component is the control plane folder's binary name with args, ready once
// healthURL answers (its HTTPS certificate is self-signed).
func (n *Node) component(name, healthURL string, args ...string) *localcluster.Component {
	return &localcluster.Component{
		Name: name, Path: filepath.Join(n.o.AssetsDir, name), Args: args,
		LogPath: filepath.Join(n.cluster.LogDir(), name+".log"),
		Ready: func(ctx context.Context) error {
			hc := &http.Client{Transport: proc.InsecureTransport()}
			defer hc.CloseIdleConnections()
			_, err := proc.GetOK(ctx, hc, healthURL)
			return err
		},
		Readiness: "healthy", StartTimeout: n.o.StartTimeout,
	}
}

// start starts c and says so.
func (n *Node) start(ctx context.Context, c *localcluster.Component) error {
	if err := c.Start(ctx); err != nil {
		return err
	}
	n.o.Progress("%s up", c.Name)
	return nil
}

func (n *Node) startScheduler(ctx context.Context) error {
	kc, err := n.cluster.Kubeconfig("kube-scheduler.kubeconfig", "system:kube-scheduler")
	if err != nil {
		return err
	}
	port, err := proc.FreePort()
	if err != nil {
		return err
	}
	n.Scheduler = n.component("kube-scheduler", fmt.Sprintf("https://127.0.0.1:%d/healthz", port),
		"--kubeconfig="+kc, "--authentication-kubeconfig="+kc, "--authorization-kubeconfig="+kc,
		"--leader-elect=false", "--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", port))
	return n.start(ctx, n.Scheduler)
}

func (n *Node) startKubelet(ctx context.Context) error {
	kc, err := n.cluster.Kubeconfig("kubelet.kubeconfig", "system:node:"+n.IP, "system:nodes")
	if err != nil {
		return err
	}
	crt, key, err := n.cluster.WriteServingCert(n.dir("kubelet-pki"), "kubelet", n.IP)
	if err != nil {
		return err
	}
	cfgPath, err := n.writeConfig("kubelet.yaml", kubeletConfig(n.IP, crt, key, n.cluster.CAFile(), n.containerdSocket(), n.dir("pods")))
	if err != nil {
		return err
	}
	n.Kubelet = n.component("kubelet", kubeletHealthz, "--config="+cfgPath, "--kubeconfig="+kc, "--root-dir="+n.dir("kubelet"),
		"--hostname-override="+n.IP, "--node-ip="+n.IP)
	return n.start(ctx, n.Kubelet)
}

// kubeletConfig is the kubelet's configuration. Webhook authentication and
// authorization: the apiserver's kubelet client certificate (system:masters)
// is allowed, anonymous requests are not.
func kubeletConfig(ip, crt, key, clientCA, containerdSocket, podLogs string) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
address: %s
port: %d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: %s
tlsPrivateKeyFile: %s
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %s}
authorization: {mode: Webhook}
containerRuntimeEndpoint: unix://%s
podLogsDir: %s
failSwapOn: false
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
# A shared development machine: evict nothing for disk space, and never
# garbage-collect the imported images (there is no registry to pull them back from).
evictionHard: {memory.available: 100Mi, nodefs.available: 1%%, imagefs.available: 1%%, nodefs.inodesFree: 1%%, imagefs.inodesFree: 1%%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
`, ip, kubeletPort, crt, key, clientCA, containerdSocket, podLogs)
}

func (n *Node) startKubeProxy(ctx context.Context) error {
	kc, err := n.cluster.Kubeconfig("kube-proxy.kubeconfig", "system:kube-proxy")
	if err != nil {
		return err
	}
	// conntrack maxPerCore 0: leave the host's conntrack table size alone.
	cfgPath, err := n.writeConfig("kube-proxy.yaml", fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: %s}
mode: iptables
hostnameOverride: %s
clusterCIDR: %s
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack: {maxPerCore: 0}
`, kc, n.IP, podCIDR))
	if err != nil {
		return err
	}
	n.KubeProxy = n.component("kube-proxy", "http://127.0.0.1:10256/healthz", "--config="+cfgPath)
	return n.start(ctx, n.KubeProxy)
}

// waitReady returns once the Node object is Ready, or a node process exited.
func (n *Node) waitReady(ctx context.Context) error {
	cs, err := kubernetes.NewForConfig(n.cluster.AdminConfig())
	if err != nil {
		return err
	}
	var last error
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, n.o.StartTimeout, true, func(ctx context.Context) (bool, error) {
		for _, c := range n.Components() {
			if run := c.Running(); run == nil {
				return false, fmt.Errorf("%s is not running", c.Name)
			} else if err := run.Exited(); err != nil {
				return false, err
			}
		}
		node, err := cs.CoreV1().Nodes().Get(ctx, n.IP, metav1.GetOptions{})
		if last = err; err == nil {
			last = errors.New("no Ready condition yet")
			for _, cond := range node.Status.Conditions {
				if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
					last = nil
				} else if cond.Type == corev1.NodeReady {
					last = fmt.Errorf("not ready: %s", cond.Message)
				}
			}
		}
		return last == nil, nil
	})
	if err != nil {
		return fmt.Errorf("node %s not Ready: %w (logs: %s)", n.IP, errors.Join(err, last), n.cluster.LogDir())
	}
	return nil
}

// writeConfig writes a component's configuration file into the node folder.
func (n *Node) writeConfig(name, cfg string) (string, error) {
	path := n.dir(name)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", err
	}
	return path, os.WriteFile(path, []byte(cfg), 0o600)
}
