package localcluster

import (
	"errors"
	"os"
	"path/filepath"
	"time"
)

// Options say what to start and where.
type Options struct {
	// Name names the cluster's certificate authorities (<Name>-ca...) and
	// etcd's cluster token; "localcluster" when empty.
	Name string
	// Dir holds etcd's data (Dir/etcd, or Dir/etcd0...) and pki/: the CAs,
	// certificates, keys and kubeconfigs.
	Dir string
	// LogDir receives each process's log, <component name>.log; Dir/logs
	// when empty.
	LogDir string
	// AssetsDir holds etcd, kube-apiserver and kube-controller-manager.
	AssetsDir string
	// Persist keeps etcd's data and the CAs in Dir from the last run, and
	// etcd syncs its writes; otherwise both start fresh and etcd skips fsync.
	Persist bool
	// Admin is the administrator (group system:masters) whose client
	// certificate AdminConfig holds and the readiness checks use; "admin"
	// when empty.
	Admin string

	// EtcdMembers is the number of etcd members: 1 (when 0) or 3.
	EtcdMembers int
	// EtcdPorts are the members' ports, in order; members without one get
	// free ports.
	EtcdPorts []EtcdPorts
	// EtcdArgs are extra etcd flags (--name=value), each replacing the
	// defaults of its name.
	EtcdArgs []string

	// APIServers is the number of kube-apiservers (1 when 0), each on its own port.
	APIServers int
	// APIServerPorts are their secure ports, in order; the others get free ports.
	APIServerPorts []int
	// APIServerArgs are extra kube-apiserver flags, as EtcdArgs.
	APIServerArgs []string
	// APIServerEachArgs are extra flags of apiserver i (its entry), after
	// APIServerArgs: one apiserver's --etcd-servers through a proxy, say.
	APIServerEachArgs [][]string
	// Balancer puts HAProxy (a Balancer) in front of the apiservers, on
	// BalancerPort or a free port: URL, the configs and kube-controller-manager
	// then go through it, and each apiserver stays addressable at its own URL.
	Balancer     bool
	BalancerPort int
	// Aggregation turns on the aggregation layer: the apiservers proxy to
	// APIServices with a front-proxy client certificate and the user in
	// X-Remote-* headers, to the APIService's endpoints.
	Aggregation bool

	// StartControllerManager starts kube-controller-manager with the rest;
	// otherwise it waits for its own Start.
	StartControllerManager bool
	// ControllerManagerArgs are extra kube-controller-manager flags, as EtcdArgs.
	ControllerManagerArgs []string

	// NodeIP is the address of a node that will join (package node): the
	// apiservers then also listen there and at ServiceIP, authorize kubelets
	// with the Node authorizer and reach them with a client certificate, and
	// kube-controller-manager runs every controller and hands pods the CA.
	NodeIP string

	// StartTimeout bounds each component's start (DefaultStartTimeout when 0).
	StartTimeout time.Duration
	// Progress, when set, hears a line per component started.
	Progress func(format string, args ...any)
}

func (o *Options) defaults() error {
	if o.Dir == "" || o.AssetsDir == "" {
		return errors.New("localcluster: Dir and AssetsDir must be set")
	}
	if o.Name == "" {
		o.Name = "localcluster"
	}
	if o.LogDir == "" {
		o.LogDir = filepath.Join(o.Dir, "logs")
	}
	if o.Admin == "" {
		o.Admin = "admin"
	}
	o.APIServers = max(o.APIServers, 1)
	if o.StartTimeout == 0 {
		o.StartTimeout = DefaultStartTimeout
	}
	if o.Progress == nil {
		o.Progress = func(string, ...any) {}
	}
	return nil
}

// EtcdPorts are a member's client and peer ports.
type EtcdPorts struct {
	Client, Peer int
}

// AssetsDir is $KUBEBUILDER_ASSETS when set, else the newest control-plane
// build under root/bin/k8s (where `make control-plane` builds).
func AssetsDir(root string) string {
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		return dir
	}
	dirs, _ := filepath.Glob(filepath.Join(root, "bin", "k8s", "*"))
	if len(dirs) == 0 {
		return filepath.Join(root, "bin", "k8s")
	}
	return dirs[len(dirs)-1] // Glob sorts
}
