package testenv

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/kubelock/kubelock/internal/pki"
)

// WebhookClientCN is the common name of the client certificate the test
// kube-apiserver presents to every admission webhook.
const WebhookClientCN = pki.WebhookClientCN

// webhookClientAuth makes the kube-apiserver present a client certificate to
// admission webhooks (pki.CA.WebhookClientConfig). Webhook servers then
// require certificates signed by caPEM (see Env.WebhookClientCA).
type webhookClientAuth struct {
	dir           string
	caPEM         []byte
	caFile        string
	admissionFile string
}

func newWebhookClientAuth() (*webhookClientAuth, error) {
	dir, err := os.MkdirTemp("", "kubelock-webhook-client-")
	if err != nil {
		return nil, err
	}
	a := &webhookClientAuth{dir: dir, caFile: filepath.Join(dir, "ca.crt")}
	ca, err := pki.New("kubelock-test-webhook-client-ca")
	if err == nil {
		a.caPEM = ca.PEM
		err = os.WriteFile(a.caFile, ca.PEM, 0o600)
	}
	if err == nil {
		a.admissionFile, err = ca.WebhookClientConfig(dir)
	}
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("testenv: webhook client certificate: %w", err)
	}
	return a, nil
}
