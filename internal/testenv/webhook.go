package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/kubelock/kubelock/webhook"
)

// WithWebhook installs the validating webhook configuration generated into
// config/webhook, pointed at a server this process runs with StartWebhook.
func WithWebhook() Option {
	return func(env *envtest.Environment) {
		env.WebhookInstallOptions.Paths = []string{filepath.Join(RepoRoot(), "config", "webhook")}
	}
}

// ControllerConfig is a connection as the controller's own user: a distinct
// name the webhook recognises, with an administrator's permissions.
func (e *Env) ControllerConfig(name string) (*rest.Config, error) {
	u, err := e.AddUser(envtest.User{Name: name, Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return nil, err
	}
	return u.Config(), nil
}

// StartWebhook serves the kubelock validator where WithWebhook registered it,
// and returns once it answers. Cancel ctx to stop it.
func (e *Env) StartWebhook(ctx context.Context, controllerUsers ...string) error {
	o := &e.WebhookInstallOptions
	if len(o.Paths) == 0 {
		return errors.New("testenv: the environment was started without WithWebhook")
	}
	v, err := webhook.NewValidator(e.Scheme, e.Client, controllerUsers...)
	if err != nil {
		return err
	}
	srv := ctrlwebhook.NewServer(ctrlwebhook.Options{Host: o.LocalServingHost, Port: o.LocalServingPort, CertDir: o.LocalServingCertDir})
	srv.Register(webhook.Path, &admission.Webhook{Handler: v})
	errc := make(chan error, 1)
	go func() { errc <- srv.Start(ctx) }()
	addr := net.JoinHostPort(o.LocalServingHost, strconv.Itoa(o.LocalServingPort))
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = conn.Close()
			return nil
		}
		select {
		case err := <-errc:
			return fmt.Errorf("testenv: webhook server stopped: %w", err)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testenv: webhook server at %s did not come up: %w", addr, err)
		}
	}
}
