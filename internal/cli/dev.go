package cli

import (
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kubelock/kubelock/internal/devenv"
)

func newDevCommand(o *options) *cobra.Command {
	d := devenv.DefaultOptions()
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run kubelock locally: etcd, kube-apiserver, the CRD and the operator, until Ctrl-C",
		Long: `dev starts a local kubelock for trying it by hand: etcd and kube-apiserver from
the control plane "make control-plane" builds (--assets-dir), the DistributedLock
CRD, the operator (controller and admission webhook) in this process with a
locally generated CA, users alice and bob (lock users) and carol (lock user with
break-glass) in namespace default, and a lock named demo. It writes an admin
kubeconfig with a context per user, prints "` + devenv.ReadyLine + `" and the next
steps, and runs until SIGINT or SIGTERM; then it stops everything it started.

Without --persist the data folder starts fresh at every start.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			d.Out, d.Progress = o.streams.Out, o.streams.ErrOut
			return devenv.Run(ctx, d)
		},
	}
	f := cmd.Flags()
	f.StringVar(&d.Dir, "data-dir", d.Dir, "data folder: etcd data, certificates, logs, kubectl links")
	f.StringVar(&d.KubeconfigOut, "kubeconfig-out", d.KubeconfigOut, "where to write the admin kubeconfig (default <data-dir>/kubeconfig)")
	f.BoolVar(&d.Persist, "persist", d.Persist, "keep etcd's data (and the CA) from the last run instead of starting fresh")
	f.StringVar(&d.AssetsDir, "assets-dir", d.AssetsDir, "folder with etcd, kube-apiserver and kubectl (default $KUBEBUILDER_ASSETS, else the newest bin/k8s/*)")
	f.IntVar(&d.APIServerPort, "apiserver-port", d.APIServerPort, "kube-apiserver port on 127.0.0.1")
	f.IntVar(&d.EtcdPort, "etcd-port", d.EtcdPort, "etcd client port on 127.0.0.1")
	f.IntVar(&d.EtcdPeerPort, "etcd-peer-port", d.EtcdPeerPort, "etcd peer port on 127.0.0.1")
	f.IntVar(&d.WebhookPort, "webhook-port", d.WebhookPort, "admission webhook port on 127.0.0.1")
	f.IntVar(&d.ProbePort, "probe-port", d.ProbePort, "operator /healthz and /readyz port on 127.0.0.1; 0 turns them off")
	f.IntVar(&d.MetricsPort, "metrics-port", d.MetricsPort, "operator metrics port on 127.0.0.1; 0 turns them off")
	f.DurationVar(&d.StartTimeout, "start-timeout", time.Minute, "how long each start-up stage may take")
	return cmd
}
