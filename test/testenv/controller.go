package testenv

import (
	"context"

	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/kubelock/kubelock/controllers"
	"github.com/kubelock/kubelock/internal/metrics"
)

// RunController runs the expiry controller in this process as the operator
// does, connected with cfg (see ControllerConfig), until stop is called; stop
// returns the manager's error. Suites may start it again after stopping it.
func (e *Env) RunController(cfg *rest.Config, opts ...controllers.Option) (stop func() error, err error) {
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 e.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		return nil, err
	}
	// A restarted controller registers its name again in this process.
	opts = append([]controllers.Option{controllers.WithControllerOptions(controller.Options{SkipNameValidation: ptr.To(true)})}, opts...)
	metrics.Register() // as the operator's main does
	if _, err := controllers.Setup(mgr, opts...); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- mgr.Start(ctx) }()
	return func() error { cancel(); return <-errc }, nil
}
