// Package devenv is kubelock-dev (`make dev`): a local kubelock on a real
// etcd, kube-apiserver and kube-controller-manager (the control plane `make
// control-plane` builds), with the CRD installed, the operator (controller and
// admission webhook) running in this process, users to try the ownership rules
// with, and a kubeconfig. It runs until its context ends and then stops
// everything it started.
package devenv

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/kubelock/kubelock/cmd/manager/operator"
	"github.com/kubelock/kubelock/internal/localcluster"
	"github.com/kubelock/kubelock/internal/localcluster/node"
	"github.com/kubelock/kubelock/internal/localcluster/node/host"
	"github.com/kubelock/kubelock/internal/locallockapi"
)

// Users of the dev cluster. Each has a client certificate signed by the dev CA.
const (
	AdminUser      = "kubelock-dev-admin"
	ControllerUser = "kubelock-dev-controller"
	// ReadyLine is printed, alone on its line, once everything is up.
	ReadyLine = "kubelock dev: ready"
)

// LockUsers are bound to the lock-user ClusterRole in namespace default;
// BreakglassUser is one too and may also force-release.
var (
	LockUsers      = []string{"alice", "bob"}
	BreakglassUser = "carol"
)

// Options configure a dev environment. Ports are on 127.0.0.1.
type Options struct {
	// Dir is the data folder: etcd's data, certificates, logs, kubectl links.
	Dir string
	// KubeconfigOut is where the admin kubeconfig (with contexts for the
	// users) is written; empty means Dir/kubeconfig.
	KubeconfigOut string
	// Persist keeps etcd's data (and the CA) from the last run; otherwise the
	// data folder starts fresh.
	Persist bool
	// AssetsDir holds etcd, kube-apiserver, kube-controller-manager and kubectl.
	AssetsDir string

	APIServerPort int
	EtcdPort      int
	EtcdPeerPort  int
	WebhookPort   int
	// ProbePort and MetricsPort serve the operator's probes and metrics; 0 turns them off.
	ProbePort   int
	MetricsPort int

	// Admission is the engine of the lock rules, as the chart's
	// admission.engine: AdmissionWebhook (the operator's webhook) or
	// AdmissionPolicy (config/policy's ValidatingAdmissionPolicies; the
	// operator's webhook then serves fenced objects only).
	Admission string

	// HA runs a highly available control plane: three etcd members (the
	// first on EtcdPort and EtcdPeerPort), two kube-apiservers on free ports
	// and HAProxy in front of them on APIServerPort, where the kubeconfig points.
	HA bool

	// Backend serves the lock API, as the chart's backend: BackendCRD (the
	// CRDs in kube-apiserver) or BackendAPIServer (kubelock-apiserver and its
	// etcd behind an APIService, no lock CRDs: processes, or with Node the
	// chart's pods).
	Backend string

	// Node runs a real node (root only): kube-scheduler, containerd, kubelet
	// and kube-proxy, with the operator deployed from config/default instead
	// of running in this process. NodeDir holds containerd, runc and the CNI
	// plugins (`make node`).
	Node    bool
	NodeDir string

	// StartTimeout bounds each start-up stage.
	StartTimeout time.Duration
	// Out receives the ready line and the next steps; Progress, one line per
	// start-up stage (nil: none).
	Out      io.Writer
	Progress io.Writer
}

// DefaultOptions are the defaults of kubelock-dev's flags.
func DefaultOptions() Options {
	return Options{
		Dir:           filepath.Join(".kubelock", "dev"),
		AssetsDir:     DefaultAssetsDir(),
		APIServerPort: 16443,
		EtcdPort:      12379,
		EtcdPeerPort:  12380,
		WebhookPort:   19443,
		Admission:     AdmissionWebhook,
		Backend:       BackendCRD,
		NodeDir:       node.DefaultBinDir(),
		StartTimeout:  time.Minute,
	}
}

// DefaultAssetsDir is $KUBEBUILDER_ASSETS, else the newest folder under
// ./bin/k8s (where `make control-plane` builds).
func DefaultAssetsDir() string { return localcluster.AssetsDir(".") }

// env is one running dev environment.
type env struct {
	o        Options
	logDir   string
	binDir   string
	kubelock string // the kubectl-lock plugin of the next steps
	cluster  *localcluster.Cluster
	admin    *rest.Config

	operatorLog string

	// The apiserver backend: kubelock-apiserver's binary and the running server.
	lockAPIBinary string
	lockAPI       *locallockapi.Server

	// --node: the node (its address names it) and the checkout it deploys from.
	node *node.Node
	root string
	// helm installs dist/chart with --backend apiserver.
	helm string
}

// Run starts the environment, prints the ready line and next steps to o.Out,
// and blocks until ctx ends or a component fails; it then stops everything it
// started, in reverse order, and returns the failure, if any.
func Run(ctx context.Context, o Options) (err error) {
	e := &env{o: o}
	if err := e.check(); err != nil {
		return err
	}
	started := time.Now()
	if err := e.prepare(); err != nil {
		return err
	}
	if o.Node {
		var h *host.Host
		if h, err = host.Claim(e.node.Host(), e.progress); err != nil {
			return err
		}
		// Deferred first, so it runs after everything else has stopped.
		defer func() { err = errors.Join(err, h.Restore()) }()
	}
	if e.cluster, err = localcluster.Start(ctx, e.clusterOptions()); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, e.cluster.Stop()) }()
	e.admin = e.cluster.AdminConfig()
	e.admin.UserAgent = "kubelock-dev"
	if err := e.refuseSwitch(ctx); err != nil {
		return err
	}
	if o.Backend == BackendAPIServer && !o.Node {
		e.lockAPI, err = e.startLockAPI(ctx)
		if e.lockAPI != nil {
			defer func() { err = errors.Join(err, e.lockAPI.Stop()) }()
		}
		if err != nil {
			return err
		}
	}
	if err := e.install(ctx); err != nil {
		return err
	}

	mgrDone := make(chan error, 1) // the in-process operator's end; never without it
	if o.Node {
		defer func() { err = errors.Join(err, e.node.Stop()) }()
		if err := e.startNode(ctx); err != nil {
			return err
		}
	} else {
		// The operator, in this process; its logs go to a file.
		mgrCtx, stopMgr := context.WithCancel(context.Background())
		if err := e.startOperator(mgrCtx, mgrDone); err != nil {
			stopMgr()
			return err
		}
		defer func() {
			stopMgr()
			if mErr := <-mgrDone; mErr != nil {
				err = errors.Join(err, fmt.Errorf("operator: %w", mErr))
			}
		}()
		if err := e.waitOperator(ctx, mgrDone); err != nil {
			return err
		}
		if err := e.registerAdmission(ctx); err != nil {
			return err
		}
		if err := e.registerFencedObjects(ctx); err != nil {
			return err
		}
	}
	if err := e.writeKubeconfig(); err != nil {
		return err
	}
	e.progress("ready after %s", time.Since(started).Round(10*time.Millisecond))
	if err := e.printNextSteps(); err != nil {
		return err
	}

	return e.serve(ctx, mgrDone)
}

// clusterOptions are the control plane kubelock-dev runs: one etcd member and
// one apiserver on the ports of its flags (with --ha, three members and two
// apiservers behind HAProxy on the apiserver's port), its data (and, with
// --persist, the data and CA of the last run) in Dir.
func (e *env) clusterOptions() localcluster.Options {
	o := &e.o
	co := localcluster.Options{
		Name: "kubelock-dev", Dir: o.Dir, LogDir: e.logDir, AssetsDir: o.AssetsDir, Persist: o.Persist,
		Admin:          AdminUser,
		EtcdPorts:      []localcluster.EtcdPorts{{Client: o.EtcdPort, Peer: o.EtcdPeerPort}},
		APIServerPorts: []int{o.APIServerPort},
		APIServerArgs:  []string{"--profiling=false"},
		Aggregation:    o.Backend == BackendAPIServer,
		// A pod's deletion deletes what it owned and a ResourceQuota counts sessions.
		StartControllerManager: true,
		StartTimeout:           o.StartTimeout,
		Progress:               e.progress,
	}
	if e.node != nil {
		co.NodeIP = e.node.IP
	}
	if o.HA {
		co.EtcdMembers, co.APIServers, co.APIServerPorts = 3, 2, nil
		co.Balancer, co.BalancerPort = true, o.APIServerPort
	}
	return co
}

// serve runs until ctx ends or a component fails. With --node, SIGUSR1
// restarts the kubelet (the cluster suite's node restart).
func (e *env) serve(ctx context.Context, mgrDone chan error) error {
	failed, done := make(chan error, 1), make(chan struct{})
	defer close(done)
	components := e.cluster.Components()
	if e.node != nil {
		components = append(components, e.node.Components()...)
	}
	var lockAPIDone <-chan struct{} // never closes without the apiserver backend
	if e.lockAPI != nil {
		components = append(components, e.lockAPI.Etcd.Components()...)
		lockAPIDone = e.lockAPI.APIServer.Done()
	}
	for _, c := range components {
		go func() {
			select {
			case err := <-c.Failed():
				select {
				case failed <- err:
				default:
				}
			case <-done:
			}
		}()
	}
	restart := make(chan os.Signal, 1)
	if e.node != nil {
		signal.Notify(restart, syscall.SIGUSR1)
		defer signal.Stop(restart)
	}
	for {
		select {
		case <-ctx.Done():
			e.progress("stopping")
			return nil
		case err := <-failed:
			return err
		case <-lockAPIDone:
			return e.lockAPI.APIServer.Exited()
		case <-restart:
			if err := e.node.RestartKubelet(ctx); err != nil {
				return err
			}
		case err := <-mgrDone:
			mgrDone <- nil // the deferred stop reads it again
			if err == nil {
				err = errors.New("stopped unexpectedly")
			}
			return fmt.Errorf("operator: %w", err)
		}
	}
}

func (e *env) progress(format string, args ...any) {
	if e.o.Progress != nil {
		_, _ = fmt.Fprintf(e.o.Progress, "kubelock dev: "+format+"\n", args...)
	}
}

// check fails early, with one line, on missing binaries and taken ports,
// and with --node when the node cannot run here.
func (e *env) check() error {
	o := &e.o
	if o.HA && o.Node {
		return errors.New("--ha and --node do not go together: the node's pods reach the apiserver through the kubernetes Service, which names one")
	}
	if o.Node {
		if err := e.checkNode(); err != nil {
			return err
		}
	}
	if o.Dir == "" {
		return errors.New("--data-dir must not be empty")
	}
	if err := checkAdmission(o.Admission); err != nil {
		return err
	}
	if err := checkBackend(o.Backend, o.Node, o.Admission); err != nil {
		return err
	}
	for _, bin := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kubectl"} {
		p := filepath.Join(o.AssetsDir, bin)
		if st, err := os.Stat(p); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			return fmt.Errorf("no %s binary at %s: build the control plane with `make control-plane` (or point --assets-dir or KUBEBUILDER_ASSETS at it)", bin, p)
		}
	}
	ports := []struct {
		flag, what string
		port       int
	}{
		{"--apiserver-port", "kube-apiserver", o.APIServerPort},
		{"--etcd-port", "etcd", o.EtcdPort},
		{"--etcd-peer-port", "etcd peer", o.EtcdPeerPort},
		{"--webhook-port", "admission webhook", o.WebhookPort},
		{"--probe-port", "operator probes", o.ProbePort},
		{"--metrics-port", "operator metrics", o.MetricsPort},
	}
	seen := map[int]string{}
	for i, p := range ports {
		if p.port == 0 && i >= 4 {
			continue // optional ones are off
		}
		if p.port < 1 || p.port > 65535 {
			return fmt.Errorf("%s must be in 1..65535, got %d", p.flag, p.port)
		}
		if other, dup := seen[p.port]; dup {
			return fmt.Errorf("%s and %s are both %d: give each its own port", other, p.flag, p.port)
		}
		seen[p.port] = p.flag
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)))
		if err != nil {
			return fmt.Errorf("port %d for the %s (%s) is already in use (another kubelock-dev?): stop what listens there or choose another port with %s", p.port, p.what, p.flag, p.flag)
		}
		_ = ln.Close()
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if e.kubelock, err = findKubelock(self); err != nil {
		return err
	}
	return e.findLockAPIServer(self)
}

// checkAdmission fails on an engine kubelock-dev does not know.
func checkAdmission(engine string) error {
	if engine != AdmissionWebhook && engine != AdmissionPolicy {
		return fmt.Errorf("--admission must be %q or %q, got %q", AdmissionWebhook, AdmissionPolicy, engine)
	}
	return nil
}

// findKubelock is the kubelock binary the next steps use as the kubectl-lock
// plugin: the one next to self (make builds both into bin/), else kubelock on
// PATH.
func findKubelock(self string) (string, error) {
	return findProgram(self, "kubelock", "the next steps use it as kubectl-lock")
}

// findProgram is the program name next to self, else on PATH; the error
// says why it is needed and which make target builds it.
func findProgram(self, name, why string) (string, error) {
	next := filepath.Join(filepath.Dir(self), name)
	if st, err := os.Stat(next); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
		return next, nil
	}
	if p, err := exec.LookPath(name); err == nil {
		return filepath.Abs(p)
	}
	return "", fmt.Errorf("no %s binary next to %s or on PATH (%s): build it with `make %s`", name, self, why, name)
}

// prepare makes the data folder: fresh unless Persist (only the entries this
// package writes are removed, never anything else in the folder; the control
// plane cleans up its own).
func (e *env) prepare() error {
	o := &e.o
	abs, err := filepath.Abs(o.Dir)
	if err != nil {
		return err
	}
	o.Dir = abs
	if o.KubeconfigOut == "" {
		o.KubeconfigOut = filepath.Join(o.Dir, "kubeconfig")
	}
	if o.KubeconfigOut, err = filepath.Abs(o.KubeconfigOut); err != nil {
		return err
	}
	if o.AssetsDir, err = filepath.Abs(o.AssetsDir); err != nil {
		return err
	}
	e.logDir, e.binDir = filepath.Join(o.Dir, "logs"), filepath.Join(o.Dir, "bin")
	if !o.Persist {
		for _, p := range []string{e.logDir, e.binDir, filepath.Join(o.Dir, "kubeconfig")} {
			if err := os.RemoveAll(p); err != nil {
				return fmt.Errorf("cleaning the data folder: %w", err)
			}
		}
	}
	for _, d := range []string{o.Dir, e.logDir, e.binDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("creating the data folder: %w", err)
		}
	}
	return nil
}

// startOperator runs the operator (controller and webhook, no leader
// election) with the dev CA's serving certificate; it authenticates as
// ControllerUser, whom the webhook lets expire holdings.
func (e *env) startOperator(ctx context.Context, done chan<- error) error {
	o := &e.o
	certDir := filepath.Join(o.Dir, "pki", "webhook")
	if _, _, err := e.cluster.WriteServingCert(certDir, "kubelock-webhook"); err != nil {
		return err
	}
	cfg, err := e.cluster.UserConfig(ControllerUser, "system:masters")
	if err != nil {
		return err
	}
	cfg.UserAgent = "kubelock-dev-operator"

	logf, err := os.OpenFile(filepath.Join(e.logDir, "operator.log"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	ctrl.SetLogger(zap.New(zap.WriteTo(logf)))

	mo := operator.DefaultOptions()
	mo.LeaderElect = false
	mo.MetricsAddr, mo.ProbeAddr = localAddr(o.MetricsPort), localAddr(o.ProbePort)
	mo.WebhookHost, mo.WebhookPort, mo.WebhookCertDir = "127.0.0.1", o.WebhookPort, certDir
	mo.CertRotation = false
	mo.WebhookClientCAFile = e.cluster.WebhookClientCAFile // only the apiserver is answered
	mo.Username = ControllerUser
	mo.WebhookControllerUsers = []string{ControllerUser}
	e.operatorLog = logf.Name()
	go func() {
		err := operator.Run(ctx, cfg, mo)
		_ = logf.Close()
		done <- err
	}()
	return nil
}

// waitOperator returns once the webhook answers TLS with the certificate the
// dev CA issued, or the operator stopped. It shows the client certificate the
// apiserver shows: the webhook refuses a handshake without one, and logs it.
func (e *env) waitOperator(ctx context.Context, done chan error) error {
	o := &e.o
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(e.cluster.CA.PEM)
	client, err := e.cluster.WebhookClientCert()
	if err != nil {
		return err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(o.WebhookPort))
	var last error
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, o.StartTimeout, true, func(ctx context.Context) (bool, error) {
		select {
		case mErr := <-done:
			done <- mErr
			return false, fmt.Errorf("operator stopped while starting: %w (log: %s)", mErr, e.operatorLog)
		default:
		}
		d := tls.Dialer{NetDialer: &net.Dialer{Timeout: time.Second}, Config: &tls.Config{
			RootCAs: pool, ServerName: "127.0.0.1", Certificates: []tls.Certificate{client}, MinVersion: tls.VersionTLS12,
		}}
		conn, err := d.DialContext(ctx, "tcp", addr)
		if last = err; err == nil {
			_ = conn.Close()
		}
		return err == nil, nil
	})
	if wait.Interrupted(err) && ctx.Err() == nil {
		return fmt.Errorf("admission webhook not serving on %s after %s: %w (log: %s)", addr, o.StartTimeout, last, e.operatorLog)
	}
	if err == nil {
		e.progress("operator up: controller and webhook server on https://%s", addr)
	}
	return err
}

func localAddr(port int) string {
	if port == 0 {
		return "0"
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}
