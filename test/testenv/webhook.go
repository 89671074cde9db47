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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
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

// FencedObjectsWebhook registers the fenced-object rule for ConfigMaps labelled
// locks.kubelock.io/fenced=true with the server StartWebhook runs, as
// config/fenced-objects does in a cluster.
func (e *Env) FencedObjectsWebhook(ctx context.Context) error {
	o := &e.WebhookInstallOptions
	url := fmt.Sprintf("https://%s%s", net.JoinHostPort(o.LocalServingHost, strconv.Itoa(o.LocalServingPort)), webhook.FencedPath)
	fail, none := admissionregistrationv1.Fail, admissionregistrationv1.SideEffectClassNone
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "kubelock-fenced-objects"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:                    "fenced.kubelock.io",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: o.LocalServingCAData},
			Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update}, Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}}}},
			ObjectSelector:          &metav1.LabelSelector{MatchLabels: map[string]string{locksv1alpha1.FencedLabel: "true"}},
			FailurePolicy:           &fail,
			SideEffects:             &none,
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
	return e.Client.Create(ctx, cfg)
}
