package pki

import (
	"errors"
	"os"
	"path/filepath"

	"sigs.k8s.io/yaml"
)

// WebhookClientCN is the common name of the client certificate a
// kube-apiserver presents to admission webhooks (WebhookClientConfig).
const WebhookClientCN = "kube-apiserver-webhook-client"

// WebhookClientConfig makes a kube-apiserver present a client certificate
// signed by ca to every admission webhook, as a cluster that lets webhooks
// verify their caller does: it writes into dir a kubeconfig with the
// certificate for every webhook ("*", whatever its host) and the
// AdmissionConfiguration that names it, and returns the latter's path
// (--admission-control-config-file).
func (ca *CA) WebhookClientConfig(dir string) (string, error) {
	crt, key, err := ca.Client(WebhookClientCN)
	if err != nil {
		return "", err
	}
	kubeconfig, err := yaml.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "Config",
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
	return admissionFile, errors.Join(os.WriteFile(kubeconfigFile, kubeconfig, 0o600), os.WriteFile(admissionFile, admission, 0o600))
}
