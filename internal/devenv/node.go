package devenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/kubelock/kubelock/internal/devenv/images"
	"github.com/kubelock/kubelock/internal/proc"
)

// The real node of --node: kube-scheduler, containerd, kubelet and kube-proxy
// next to the control plane, pods on a CNI bridge, and the operator deployed
// from config/default with images built from the checkout.
const (
	// ManagerImage and KubelockImage are the images config/default and the
	// samples name; they are imported, never pulled (imagePullPolicy: Never,
	// or IfNotPresent in the samples), as are the samples' app images.
	ManagerImage    = "kubelock/manager:latest"
	KubelockImage   = "kubelock:latest"
	appImage        = "orders-writer:latest"
	migrationsImage = "orders-migrations:latest"
	pauseImage      = "kubelock.local/pause:latest"
	// OperatorNamespace and OperatorDeployment are config/default's.
	OperatorNamespace  = "kubelock-system"
	OperatorDeployment = "kubelock-controller-manager"
	// operatorServiceAccount is config/default's account of the operator's pods.
	operatorServiceAccount = "kubelock-controller-manager"

	serviceCIDR = "10.0.0.0/24"
	serviceIP   = "10.0.0.1" // the kubernetes Service: the first address of serviceCIDR
	podCIDR     = "10.244.0.0/24"
	bridgeName  = "kubelock0"
	// The kubelet's and kube-proxy's ports are fixed: one node per machine.
	kubeletPort    = 10250
	kubeletHealthz = "http://127.0.0.1:10248/healthz"
)

// DefaultNodeDir is where `make node` builds containerd, runc and the CNI plugins.
func DefaultNodeDir() string { return filepath.Join("bin", "node") }

// nodeBinaries are what --node needs besides the control plane, by folder.
func (e *env) nodeBinaries() map[string][]string {
	return map[string][]string{
		e.o.AssetsDir: {"kube-scheduler", "kubelet", "kube-proxy"},
		e.o.NodeDir:   {"containerd", "containerd-shim-runc-v2", "ctr", "runc", "cni/bridge", "cni/host-local", "cni/loopback", "cni/portmap"},
	}
}

// checkNode fails early, in one line, without root or node binaries, or when
// another node runs on this machine.
func (e *env) checkNode() error {
	if os.Geteuid() != 0 {
		return errors.New("--node runs kubelet, containerd and kube-proxy, which need root: run it as root (sudo), or drop --node for the process-only environment")
	}
	for dir, bins := range e.nodeBinaries() {
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
	ip, err := primaryIPv4()
	if err != nil {
		return err
	}
	e.nodeIP = ip
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

// nodeDir holds the node's configuration and state under the data folder.
func (e *env) nodeDir(parts ...string) string {
	return filepath.Join(append([]string{e.o.Dir, "node"}, parts...)...)
}

// userKubeconfig writes a kubeconfig for a client certificate of user (in
// groups) into the pki folder and returns its path.
func (e *env) userKubeconfig(file, user string, groups ...string) (string, error) {
	crt, key, err := e.ca.Client(user, groups...)
	if err != nil {
		return "", err
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["dev"] = &clientcmdapi.Cluster{Server: e.admin.Host, CertificateAuthorityData: e.ca.PEM}
	kc.AuthInfos["user"] = &clientcmdapi.AuthInfo{ClientCertificateData: crt, ClientKeyData: key}
	kc.Contexts["dev"] = &clientcmdapi.Context{Cluster: "dev", AuthInfo: "user"}
	kc.CurrentContext = "dev"
	path := filepath.Join(e.pkiDir, file)
	return path, clientcmd.WriteToFile(*kc, path)
}

// startNode starts the node and deploys the operator onto it.
func (e *env) startNode(ctx context.Context) error {
	ctrl.SetLogger(zap.New(zap.WriteTo(io.Discard))) // this process runs clients only
	if err := e.buildImages(ctx); err != nil {
		return err
	}
	started := time.Now()
	e.nodeFrom = len(e.children)
	for _, step := range []func(context.Context) error{e.startScheduler, e.startContainerd, e.startKubelet, e.startKubeProxy, e.waitNodeReady} {
		if err := step(ctx); err != nil {
			return err
		}
	}
	e.progress("node %s Ready after %s", e.nodeIP, time.Since(started).Round(10*time.Millisecond))
	return e.deployOperator(ctx)
}

// buildImages builds manager, kubelock, pause and the samples' app as static
// binaries from the checkout (the working directory's module) and writes them
// as images.
func (e *env) buildImages(ctx context.Context) error {
	started := time.Now()
	dir := e.nodeDir("images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	root, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "github.com/kubelock/kubelock").Output()
	if err != nil {
		return errors.New("--node builds its images from the checkout: run kubelock-dev from the repository (with go on PATH)")
	}
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", dir+"/", "./cmd/manager", "./cmd/kubelock", "./internal/devenv/pause", "./config/samples/app")
	e.root = strings.TrimSpace(string(root))
	build.Dir = e.root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("building the images' binaries: %w: %s", err, out)
	}
	e.imageArchive = filepath.Join(dir, "images.tar")
	bin := func(names ...string) []string {
		for i, n := range names {
			names[i] = filepath.Join(dir, n)
		}
		return names
	}
	err = images.WriteArchive(e.imageArchive,
		images.Image{Ref: ManagerImage, Binaries: bin("manager")},
		images.Image{Ref: KubelockImage, Binaries: bin("kubelock")},
		images.Image{Ref: pauseImage, Binaries: bin("pause")},
		images.Image{Ref: appImage, Binaries: bin("app")},
		images.Image{Ref: migrationsImage, Binaries: bin("app", "kubelock")})
	if err != nil {
		return fmt.Errorf("writing the images: %w", err)
	}
	e.progress("built images %s, %s, %s, %s and %s from the checkout in %s", ManagerImage, KubelockImage, appImage, migrationsImage, pauseImage, time.Since(started).Round(10*time.Millisecond))
	return nil
}

func (e *env) startScheduler(ctx context.Context) error {
	kc, err := e.userKubeconfig("kube-scheduler.kubeconfig", "system:kube-scheduler")
	if err != nil {
		return err
	}
	port, err := proc.FreePort()
	if err != nil {
		return err
	}
	return e.runComponent(ctx, "kube-scheduler", fmt.Sprintf("https://127.0.0.1:%d/healthz", port),
		"--kubeconfig="+kc, "--authentication-kubeconfig="+kc, "--authorization-kubeconfig="+kc,
		"--leader-elect=false", "--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", port))
}

// runComponent starts the control plane folder's binary name with args and
// waits for its health endpoint (its HTTPS certificate is self-signed).
func (e *env) runComponent(ctx context.Context, name, healthURL string, args ...string) error {
	c, err := proc.Start(name, filepath.Join(e.o.AssetsDir, name), filepath.Join(e.logDir, name+".log"), args...)
	if err != nil {
		return err
	}
	e.children = append(e.children, c)
	hc := &http.Client{Transport: proc.InsecureTransport()}
	defer hc.CloseIdleConnections()
	err = c.WaitFor(ctx, "healthy", e.o.StartTimeout, func(ctx context.Context) error {
		_, err := proc.GetOK(ctx, hc, healthURL)
		return err
	})
	if err == nil {
		e.progress("%s up", name)
	}
	return err
}

// writeConfig writes a component's configuration file into the node folder.
func (e *env) writeConfig(name, cfg string) (string, error) {
	path := e.nodeDir(name)
	return path, writeFile(path, []byte(cfg))
}

func (e *env) containerdSocket() string { return e.nodeDir("containerd", "containerd.sock") }

func (e *env) startContainerd(ctx context.Context) error {
	bin, err := filepath.Abs(e.o.NodeDir)
	if err != nil {
		return err
	}
	cniConf := e.nodeDir("cni", "net.d")
	if err := os.MkdirAll(cniConf, 0o755); err != nil {
		return err
	}
	// The bridge's gateway is the host: pods reach the apiserver on the node IP
	// without masquerading, so the plugins leave no iptables rules behind.
	conflist := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "kubelock-dev",
  "plugins": [
    {"type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, bridgeName, podCIDR, e.nodeDir("cni", "ipam"))
	if err := writeFile(filepath.Join(cniConf, "10-kubelock-dev.conflist"), []byte(conflist)); err != nil {
		return err
	}
	// cgroupfs (these machines have cgroup v1 and no systemd cgroup driver), and
	// restrict_oom_score_adj: root may lack CAP_SYS_RESOURCE, and runc then fails
	// to lower a sandbox's OOM score.
	cfg := fmt.Sprintf(`version = 3
root = %q
state = %q
[grpc]
  address = %q
[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %q
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = %q
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [%q]
    conf_dir = %q
`, e.nodeDir("containerd", "root"), e.nodeDir("containerd", "state"), e.containerdSocket(), pauseImage,
		filepath.Join(bin, "runc"), filepath.Join(bin, "cni"), cniConf)
	cfgPath := e.nodeDir("containerd", "config.toml")
	if err := os.MkdirAll(filepath.Dir(cfgPath), 0o700); err != nil {
		return err
	}
	if err := writeFile(cfgPath, []byte(cfg)); err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(bin, "containerd"), "--config", cfgPath, "--log-level", "warn")
	cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH")) // the shim and runc
	c, err := proc.StartCmd("containerd", cmd, filepath.Join(e.logDir, "containerd.log"))
	if err != nil {
		return err
	}
	e.children = append(e.children, c)
	err = c.WaitFor(ctx, "serving", e.o.StartTimeout, func(ctx context.Context) error {
		return e.ctr(ctx, "version")
	})
	if err != nil {
		return err
	}
	if err := e.ctr(ctx, "images", "import", "--platform", "linux/"+runtime.GOARCH, e.imageArchive); err != nil {
		return fmt.Errorf("importing the images: %w", err)
	}
	e.progress("containerd up; images imported")
	return nil
}

// ctr runs containerd's client in the CRI's namespace.
func (e *env) ctr(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(e.o.NodeDir, "ctr"), append([]string{"--address", e.containerdSocket(), "-n", "k8s.io"}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func (e *env) startKubelet(ctx context.Context) error {
	kc, err := e.userKubeconfig("kubelet.kubeconfig", "system:node:"+e.nodeIP, "system:nodes")
	if err != nil {
		return err
	}
	crt, key, err := e.ca.Serving("kubelet", e.nodeIP)
	if err != nil {
		return err
	}
	crtPath, keyPath, err := writePair(e.pkiDir, "kubelet.crt", "kubelet.key", crt, key)
	if err != nil {
		return err
	}
	// Webhook authentication and authorization: the apiserver's kubelet client
	// certificate (system:masters) is allowed, anonymous requests are not.
	cfg := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
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
`, e.nodeIP, kubeletPort, crtPath, keyPath, filepath.Join(e.pkiDir, "ca.crt"), e.containerdSocket(), e.nodeDir("pods"))
	cfgPath, err := e.writeConfig("kubelet.yaml", cfg)
	if err != nil {
		return err
	}
	e.kubeletArgs = []string{"--config=" + cfgPath, "--kubeconfig=" + kc, "--root-dir=" + e.nodeDir("kubelet"),
		"--hostname-override=" + e.nodeIP, "--node-ip=" + e.nodeIP}
	return e.runComponent(ctx, "kubelet", kubeletHealthz, e.kubeletArgs...)
}

// restartKubelet stops the kubelet and starts it again in its place among
// the children. The pods' containers run on under containerd meanwhile, and
// the restarted kubelet takes them over.
func (e *env) restartKubelet(ctx context.Context) (*proc.Child, error) {
	i := slices.IndexFunc(e.children, func(c *proc.Child) bool { return c.Name == "kubelet" })
	if i < 0 {
		return nil, errors.New("no kubelet to restart")
	}
	started := time.Now()
	if err := e.children[i].Stop(20 * time.Second); err != nil {
		return nil, err
	}
	e.progress("kubelet stopped; starting it again")
	err := e.runComponent(ctx, "kubelet", kubeletHealthz, e.kubeletArgs...)
	last := len(e.children) - 1
	c := e.children[last]
	e.children[i], e.children = c, e.children[:last]
	if err != nil {
		return nil, err
	}
	e.progress("kubelet restarted in %s", time.Since(started).Round(10*time.Millisecond))
	return c, nil
}

func (e *env) startKubeProxy(ctx context.Context) error {
	kc, err := e.userKubeconfig("kube-proxy.kubeconfig", "system:kube-proxy")
	if err != nil {
		return err
	}
	// conntrack maxPerCore 0: leave the host's conntrack table size alone.
	cfg := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: %s}
mode: iptables
hostnameOverride: %s
clusterCIDR: %s
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack: {maxPerCore: 0}
`, kc, e.nodeIP, podCIDR)
	cfgPath, err := e.writeConfig("kube-proxy.yaml", cfg)
	if err != nil {
		return err
	}
	return e.runComponent(ctx, "kube-proxy", "http://127.0.0.1:10256/healthz", "--config="+cfgPath)
}

func (e *env) waitNodeReady(ctx context.Context) error {
	c, err := e.client()
	if err != nil {
		return err
	}
	var last error
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, e.o.StartTimeout, true, func(ctx context.Context) (bool, error) {
		for _, ch := range e.children {
			if err := ch.Exited(); err != nil {
				return false, err
			}
		}
		n := &corev1.Node{}
		if last = c.Get(ctx, client.ObjectKey{Name: e.nodeIP}, n); last == nil {
			last = errors.New("no Ready condition yet")
			for _, cond := range n.Status.Conditions {
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
		return fmt.Errorf("node %s not Ready: %w (logs: %s)", e.nodeIP, errors.Join(err, last), e.logDir)
	}
	return nil
}

// deployOperator applies config/default (the CRDs, RBAC, the Deployment of 2
// replicas with leader election, the webhook behind its Service) and
// config/fenced-objects, with the imported image and imagePullPolicy Never,
// and returns once the Deployment is available and the apiserver enforces
// the lock rules and the fenced-objects webhook through the Service. With the
// policy engine, as the chart's admission.engine=policy: config/policy's
// policies instead of the lock webhook, and the operator's webhook serves
// fenced objects only.
func (e *env) deployOperator(ctx context.Context) error {
	started := time.Now()
	c, err := e.client()
	if err != nil {
		return err
	}
	policy := e.o.Admission == AdmissionPolicy
	for _, k := range []string{"config/default", "config/fenced-objects"} {
		out, err := exec.CommandContext(ctx, filepath.Join(e.o.AssetsDir, "kubectl"), "kustomize", filepath.Join(e.root, k)).Output()
		if err != nil {
			return fmt.Errorf("kubectl kustomize %s: %w", k, err)
		}
		objs, err := decodeObjects(out)
		if err != nil {
			return fmt.Errorf("reading %s: %w", k, err)
		}
		for _, o := range objs {
			if policy && o.GetKind() == "ValidatingWebhookConfiguration" && o.GetName() == WebhookConfigName {
				continue
			}
			if o.GetKind() == "Deployment" {
				if err := neverPull(o); err != nil {
					return err
				}
				if policy {
					if err := fencedWebhookOnly(o); err != nil {
						return err
					}
				}
			}
			if err := apply(ctx, c, o); err != nil {
				return fmt.Errorf("applying %s %s: %w", o.GetKind(), o.GetName(), err)
			}
		}
	}
	var last error
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*e.o.StartTimeout, true, func(ctx context.Context) (bool, error) {
		d := &appsv1.Deployment{}
		if last = c.Get(ctx, client.ObjectKey{Namespace: OperatorNamespace, Name: OperatorDeployment}, d); last == nil {
			if s, want := d.Status, *d.Spec.Replicas; s.AvailableReplicas != want || s.UpdatedReplicas != want {
				last = fmt.Errorf("%d of %d replicas available", s.AvailableReplicas, want)
			}
		}
		return last == nil, nil
	})
	if err != nil {
		return fmt.Errorf("the operator's Deployment %s/%s: %w (kubectl -n %s describe pods; logs in %s)", OperatorNamespace, OperatorDeployment, errors.Join(err, last), OperatorNamespace, e.logDir)
	}
	e.progress("operator Deployment %s/%s available after %s (the node's first pods)", OperatorNamespace, OperatorDeployment, time.Since(started).Round(10*time.Millisecond))
	service := fmt.Sprintf("Service %s/kubelock-webhook-service", OperatorNamespace)
	if policy {
		err = e.registerPolicy(ctx, c, "system:serviceaccount:"+OperatorNamespace+":"+operatorServiceAccount)
	} else {
		err = e.waitAdmission(ctx, c, webhookDenial, "the admission webhook behind "+service)
	}
	if err != nil {
		return err
	}
	if err := e.waitFencedWebhook(ctx, c, service); err != nil {
		return err
	}
	return bindConfigMapWriters(ctx, c)
}

// fencedWebhookOnly points the manager's certificate rotation at the
// fenced-objects webhook configuration, the only one there is with the
// policy engine, as the chart's Deployment does for admission.engine=policy.
func fencedWebhookOnly(d *unstructured.Unstructured) error {
	path := []string{"spec", "template", "spec", "containers"}
	cs, _, err := unstructured.NestedSlice(d.Object, path...)
	if err != nil {
		return err
	}
	for _, c := range cs {
		m, ok := c.(map[string]any)
		if !ok || m["name"] != "manager" {
			continue
		}
		args, _ := m["args"].([]any)
		for i, a := range args {
			if s, _ := a.(string); strings.HasPrefix(s, "--webhook-config-name=") {
				args[i] = "--webhook-config-name=" + FencedWebhookConfigName
			}
		}
		m["args"] = append(args, "--fenced-webhook-config-name=")
	}
	return unstructured.SetNestedSlice(d.Object, cs, path...)
}

// neverPull sets every container of a Deployment to imagePullPolicy Never:
// its images were imported.
func neverPull(d *unstructured.Unstructured) error {
	for _, field := range []string{"containers", "initContainers"} {
		path := []string{"spec", "template", "spec", field}
		cs, found, err := unstructured.NestedSlice(d.Object, path...)
		if err != nil || !found {
			continue
		}
		for _, c := range cs {
			if m, ok := c.(map[string]any); ok {
				m["imagePullPolicy"] = string(corev1.PullNever)
			}
		}
		if err := unstructured.SetNestedSlice(d.Object, cs, path...); err != nil {
			return err
		}
	}
	return nil
}
