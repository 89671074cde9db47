package devenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
)

// Exit codes of kubelock-dev, as kubelock's: 1 for a failure, 64 for bad
// flags or arguments (sysexits EX_USAGE).
const (
	exitError = 1
	exitUsage = 64
)

// Main runs kubelock-dev with args (args[0] is the program name) until SIGINT
// or SIGTERM and returns the exit code. Errors go to stderr as one line.
func Main(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cmd := NewCommand(stdout, stderr)
	cmd.SetArgs(args[1:])
	err := cmd.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	_, _ = fmt.Fprintln(stderr, "kubelock-dev: "+strings.Join(strings.Fields(err.Error()), " "))
	if ue := (usageError{}); errors.As(err, &ue) {
		return exitUsage
	}
	return exitError
}

type usageError struct{ error }

// NewCommand is the kubelock-dev command; Out receives the ready line and the
// next steps, ErrOut the start-up stages.
func NewCommand(stdout, stderr io.Writer) *cobra.Command {
	d := DefaultOptions()
	cmd := &cobra.Command{
		Use:   "kubelock-dev",
		Short: "Run kubelock locally: etcd, kube-apiserver, the CRD and the operator, until Ctrl-C",
		Long: `kubelock-dev starts a local kubelock for trying it by hand: etcd,
kube-apiserver and kube-controller-manager (garbage collector, namespace,
service-account and resource quota controllers) from the control plane "make control-plane" builds
(--assets-dir), the DistributedLock CRD, the operator (controller and admission webhook) in this
process with a locally generated CA, users alice and bob (lock users) and carol
(lock user with break-glass) in namespace default, and a lock named demo. It
writes an admin kubeconfig with a context per user, links kubectl and the kubelock
next to it (or on PATH) as the kubectl-lock plugin, prints "` + ReadyLine + `"
and the next steps, and runs until SIGINT or SIGTERM; then it stops everything it
started. "make dev" builds it and runs it.

Without --persist the data folder starts fresh at every start.

--admission chooses the engine of the lock rules, as the chart's
admission.engine: "webhook" (the default: the operator's validating webhook) or
"policy" (config/policy's ValidatingAdmissionPolicies and bindings, evaluated
inside kube-apiserver, and no webhook for lock writes; the operator's webhook
serves fenced objects only; with --node, config/default goes in without its
lock webhook configuration, as the chart leaves it out). Both deny the same
writes with the same [kubelock:<rule>] tags; "make dev ADMISSION=policy"
passes it.

With --ha it runs a highly available control plane instead: three etcd members
(the first on --etcd-port and --etcd-peer-port), two kube-apiservers on free ports
and HAProxy in front of them on --apiserver-port (TCP, TLS passed through, each
apiserver's /readyz checked every second), where the kubeconfig points; the
start-up lines print every endpoint. HAProxy comes from Debian's package ("make
test-deps" installs it).

--backend chooses where the lock API is served from, as the chart's backend:
"crd" (the default: the lock CRDs in kube-apiserver) or "apiserver"
(kubelock-apiserver and an etcd of its own as processes, registered by an
APIService, with kube-apiserver's aggregation layer on; no lock CRDs; the
lock rules run in kubelock-apiserver, and the operator's webhook serves fenced
objects only). It refuses to start while the cluster's data (--persist) has
the other backend installed: a switch while it holds locks could let a
fencing token go down. "make dev BACKEND=apiserver" passes it.

With --node (root only; "make dev NODE=1") it also runs a real node: kube-scheduler,
containerd, kubelet and kube-proxy with pods on a CNI bridge, imports images of the
operator and kubelock built from the checkout, and deploys the operator from
config/default instead of running it in this process. One node per machine; on
SIGINT or SIGTERM it puts the host back as it found it. SIGUSR1 restarts the
kubelet (the pods run on).

--backend apiserver (with --node; "make dev NODE=1 BACKEND=apiserver") serves the
lock API from kubelock-apiserver instead of the CRDs: it installs dist/chart with
backend=apiserver (helm, from "make helm"), so kubelock-apiserver, its etcd
and the operator run as pods from images built from the checkout.`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError{fmt.Errorf("unexpected argument %q: kubelock-dev takes flags only", args[0])}
			}
			return nil
		},
		SilenceErrors: true,
		SilenceUsage:  true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			d.Out, d.Progress = stdout, stderr
			return Run(cmd.Context(), d)
		},
	}
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	f := cmd.Flags()
	f.StringVar(&d.Dir, "data-dir", d.Dir, "data folder: etcd data, certificates, logs, kubectl links")
	f.StringVar(&d.KubeconfigOut, "kubeconfig-out", d.KubeconfigOut, "where to write the admin kubeconfig (default <data-dir>/kubeconfig)")
	f.BoolVar(&d.Persist, "persist", d.Persist, "keep etcd's data (and the CA) from the last run instead of starting fresh")
	f.StringVar(&d.AssetsDir, "assets-dir", d.AssetsDir, "folder with etcd, kube-apiserver, kube-controller-manager and kubectl (default $KUBEBUILDER_ASSETS, else the newest bin/k8s/*)")
	f.IntVar(&d.APIServerPort, "apiserver-port", d.APIServerPort, "kube-apiserver port on 127.0.0.1")
	f.IntVar(&d.EtcdPort, "etcd-port", d.EtcdPort, "etcd client port on 127.0.0.1")
	f.IntVar(&d.EtcdPeerPort, "etcd-peer-port", d.EtcdPeerPort, "etcd peer port on 127.0.0.1")
	f.IntVar(&d.WebhookPort, "webhook-port", d.WebhookPort, "admission webhook port on 127.0.0.1")
	f.IntVar(&d.ProbePort, "probe-port", d.ProbePort, "operator /healthz and /readyz port on 127.0.0.1; 0 turns them off")
	f.IntVar(&d.MetricsPort, "metrics-port", d.MetricsPort, "operator metrics port on 127.0.0.1; 0 turns them off")
	f.Var((*admissionFlag)(&d.Admission), "admission", `admission engine of the lock rules, as the chart's admission.engine: "webhook" (the operator's webhook) or "policy" (config/policy's ValidatingAdmissionPolicies)`)
	f.BoolVar(&d.HA, "ha", d.HA, "run three etcd members and two kube-apiservers behind HAProxy (on --apiserver-port) instead of one of each")
	f.StringVar(&d.Backend, "backend", d.Backend, `backend serving the lock API, as the chart's backend: "crd" (the CRDs in kube-apiserver) or "apiserver" (kubelock-apiserver and its etcd behind an APIService: processes, or with --node the chart's pods)`)
	f.BoolVar(&d.Node, "node", d.Node, "run a real node as root (kube-scheduler, containerd, kubelet, kube-proxy, which make node builds) and deploy the operator from config/default with images built from the checkout")
	f.StringVar(&d.NodeDir, "node-dir", d.NodeDir, "folder with containerd, ctr, the runc shim, runc and cni/ (with --node)")
	f.DurationVar(&d.StartTimeout, "start-timeout", d.StartTimeout, "how long each start-up stage may take")
	return cmd
}

// admissionFlag is --admission: an unknown engine is a usage error.
type admissionFlag string

func (a *admissionFlag) String() string { return string(*a) }
func (a *admissionFlag) Type() string   { return "engine" }

func (a *admissionFlag) Set(v string) error {
	if err := checkAdmission(v); err != nil {
		return err
	}
	*a = admissionFlag(v)
	return nil
}
