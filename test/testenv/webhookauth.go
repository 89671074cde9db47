package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"time"

	"sigs.k8s.io/yaml"
)

// WebhookClientCN is the common name of the client certificate the test
// kube-apiserver presents to every admission webhook.
const WebhookClientCN = "kube-apiserver-webhook-client"

// webhookClientAuth makes the kube-apiserver present a client certificate to
// admission webhooks, as a cluster that lets webhooks verify their caller does:
// an AdmissionConfiguration (--admission-control-config-file) whose
// WebhookAdmissionConfiguration names a kubeconfig with a client certificate
// for every webhook ("*"). Webhook servers then require certificates signed by
// caPEM (see Env.WebhookClientCA).
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
	a := &webhookClientAuth{dir: dir, caFile: filepath.Join(dir, "ca.crt"), admissionFile: filepath.Join(dir, "admission.yaml")}
	if err := a.write(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("testenv: webhook client certificate: %w", err)
	}
	return a, nil
}

func (a *webhookClientAuth) write() error {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kubelock-test-webhook-client-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true, IsCA: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: WebhookClientCN},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: ca.NotAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, ca, key.Public(), caKey)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	a.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	kubeconfig, err := yaml.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "Config",
		"users": []any{map[string]any{"name": "*", "user": map[string]any{
			"client-certificate-data": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
			"client-key-data":         pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		}}},
	})
	if err != nil {
		return err
	}
	kubeconfigFile := filepath.Join(a.dir, "webhook-kubeconfig.yaml")
	plugin := func(name string) map[string]any {
		return map[string]any{"name": name, "configuration": map[string]any{
			"apiVersion": "apiserver.config.k8s.io/v1", "kind": "WebhookAdmissionConfiguration",
			"kubeConfigFile": kubeconfigFile,
		}}
	}
	admission, err := yaml.Marshal(map[string]any{
		"apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration",
		"plugins": []any{plugin("ValidatingAdmissionWebhook"), plugin("MutatingAdmissionWebhook")},
	})
	if err != nil {
		return err
	}
	return errors.Join(
		os.WriteFile(a.caFile, a.caPEM, 0o600),
		os.WriteFile(kubeconfigFile, kubeconfig, 0o600),
		os.WriteFile(a.admissionFile, admission, 0o600),
	)
}
