package testenv

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/yaml"

	kubelockconfig "github.com/kubelock/kubelock/config"
	"github.com/kubelock/kubelock/internal/metrics"
	"github.com/kubelock/kubelock/webhook"
)

// WithWebhook installs the validating webhook configuration generated into
// config/webhook, pointed at a server this process runs with StartWebhook
// (which also serves webhook.FencedPath; see FencedObjectsWebhook).
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
	srv := ctrlwebhook.NewServer(ctrlwebhook.Options{
		Host: o.LocalServingHost, Port: o.LocalServingPort, CertDir: o.LocalServingCertDir,
		TLSOpts: []func(*tls.Config){e.RequireWebhookClientCert},
	})
	metrics.Register() // as the operator's main does
	if err := webhook.Setup(srv, e.Scheme, e.Client, e.Client, controllerUsers...); err != nil {
		return err
	}
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

// RequireWebhookClientCert makes a webhook server's TLS require the client
// certificate this control plane's apiserver presents (WebhookClientCA), as
// the manager's --webhook-client-ca-file does.
func (e *Env) RequireWebhookClientCert(c *tls.Config) {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(e.WebhookClientCA)
	c.ClientCAs = pool
	c.ClientAuth = tls.RequireAndVerifyClientCert
}

// FencedObjectsWebhook registers config/fenced-objects/webhook.yaml as
// shipped (CREATE, UPDATE and DELETE of ConfigMaps labelled
// locks.kubelock.io/fenced=true), pointed at the server StartWebhook runs.
func (e *Env) FencedObjectsWebhook(ctx context.Context) error {
	data, err := kubelockconfig.FS.ReadFile("fenced-objects/webhook.yaml")
	if err != nil {
		return err
	}
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := yaml.Unmarshal(data, cfg); err != nil {
		return err
	}
	o := &e.WebhookInstallOptions
	url := "https://" + net.JoinHostPort(o.LocalServingHost, strconv.Itoa(o.LocalServingPort)) + webhook.FencedPath
	cfg.Annotations = nil // cert-manager's, here the CA bundle is set directly
	for i := range cfg.Webhooks {
		cfg.Webhooks[i].ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: o.LocalServingCAData}
	}
	return e.Client.Create(ctx, cfg)
}
