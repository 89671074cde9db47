//go:build faults

package faults

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"

	"github.com/kubelock/kubelock/internal/pki"
)

// newCA is the suite's one CA, written to dir/ca.crt: it signs the
// apiserver's and the webhook's serving certificates and every user's client
// certificate.
func newCA(dir string) (*pki.CA, string) {
	ca, err := pki.New("kubelock-faults-ca")
	must(err)
	path := filepath.Join(dir, "ca.crt")
	must(os.WriteFile(path, ca.PEM, 0o644))
	return ca, path
}

// servingPair writes a serving certificate for 127.0.0.1 as dir/tls.crt and dir/tls.key.
func servingPair(ca *pki.CA, dir string) (certPath, keyPath string) {
	c, k, err := ca.Serving("127.0.0.1")
	must(err)
	must(os.MkdirAll(dir, 0o755))
	certPath, keyPath = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	must(os.WriteFile(certPath, c, 0o644))
	must(os.WriteFile(keyPath, k, 0o600))
	return certPath, keyPath
}

// serviceAccountKey writes an RSA key for the apiserver's service-account tokens.
func serviceAccountKey(dir string) string {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	must(err)
	path := filepath.Join(dir, "sa.key")
	must(os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600))
	return path
}
