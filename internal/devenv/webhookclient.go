package devenv

import "path/filepath"

// The dev kube-apiserver presents a client certificate to admission webhooks
// and the operator's webhook requires it (--webhook-client-ca-file), so only
// the apiserver gets answers from the webhook. The certificate comes from a CA
// of its own: the dev CA also signs every user's certificate, and users must
// not be able to call the webhook directly.

// webhookClientDir holds that CA, the apiserver's kubeconfig for webhooks and
// its AdmissionConfiguration.
func (e *env) webhookClientDir() string { return filepath.Join(e.pkiDir, "webhook-client") }

// webhookClientCAFile is the CA the operator's webhook requires.
func (e *env) webhookClientCAFile() string { return filepath.Join(e.webhookClientDir(), "ca.crt") }

// webhookClientAuth returns the AdmissionConfiguration file
// (--admission-control-config-file) that makes the apiserver present its
// webhook client certificate to every webhook.
func (e *env) webhookClientAuth() (string, error) {
	ca, err := loadOrCreateCA(e.webhookClientDir(), e.o.Persist)
	if err != nil {
		return "", err
	}
	return ca.WebhookClientConfig(e.webhookClientDir())
}
