package lockapiserver

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/kubelock/kubelock/internal/lockbackend"
)

// checkBackend refuses to serve while the lock CRDs are installed in the
// cluster of kubeconfig (in-cluster when empty): kube-apiserver would serve
// the group version from them, and switching backends while they hold locks
// could let a fencing token go down (lockbackend.Check).
func checkBackend(ctx context.Context, kubeconfig string, to lockbackend.Backend) error {
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return fmt.Errorf("the backend check's connection to kube-apiserver: %w", err)
	}
	// The client's own logs go where the server's go.
	ctrllog.SetLogger(klog.Background())
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return err
	}
	return lockbackend.Check(ctx, c, to)
}

// newCheckBackendCommand is `kubelock-apiserver check-backend crd|apiserver`:
// for an installer about to serve the lock API from that backend; it fails,
// saying why, while the other backend is installed.
func newCheckBackendCommand() *cobra.Command {
	var kubeconfig string
	cmd := &cobra.Command{
		Use:   "check-backend crd|apiserver",
		Short: "Fail, saying why, while the lock API is served by the other backend (switching while it holds locks could let a fencing token go down)",
		Args:  cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			to, err := lockbackend.Parse(args[0])
			if err != nil {
				return err
			}
			return checkBackend(c.Context(), kubeconfig, to)
		},
	}
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of kube-apiserver (in-cluster when empty)")
	return cmd
}
