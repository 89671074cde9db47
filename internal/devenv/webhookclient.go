package devenv

import (
	"errors"
	"path/filepath"

	"sigs.k8s.io/yaml"
)

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

// webhookClientAuth issues the apiserver's webhook client certificate and
// returns the AdmissionConfiguration file (--admission-control-config-file)
// that makes the apiserver present it to every webhook.
func (e *env) webhookClientAuth() (string, error) {
	dir := e.webhookClientDir()
	ca, err := loadOrCreatePKI(dir, e.o.Persist)
	if err != nil {
		return "", err
	}
	crt, key, err := ca.client("kube-apiserver-webhook-client")
	if err != nil {
		return "", err
	}
	kubeconfig, err := yaml.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "Config",
		// "*": every webhook, whatever its host.
		"users": []any{map[string]any{"name": "*", "user": map[string]any{"client-certificate-data": crt, "client-key-data": key}}},
	})
	if err != nil {
		return "", err
	}
	kubeconfigFile, admissionFile := filepath.Join(dir, "webhook-kubeconfig.yaml"), filepath.Join(dir, "admission.yaml")
	plugin := func(name string) map[string]any {
		return map[string]any{"name": name, "configuration": map[string]any{
			"apiVersion": "apiserver.config.k8s.io/v1", "kind": "WebhookAdmissionConfiguration", "kubeConfigFile": kubeconfigFile,
		}}
	}
	admission, err := yaml.Marshal(map[string]any{
		"apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration",
		"plugins": []any{plugin("ValidatingAdmissionWebhook"), plugin("MutatingAdmissionWebhook")},
	})
	if err != nil {
		return "", err
	}
	return admissionFile, errors.Join(writeFile(kubeconfigFile, kubeconfig), writeFile(admissionFile, admission))
}
