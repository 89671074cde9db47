//go:build faults

package faults

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is the suite's one CA: it signs the apiserver's and the webhook's
// serving certificates and every user's client certificate.
type pki struct {
	dir   string
	cert  *x509.Certificate
	key   *ecdsa.PrivateKey
	caPEM []byte
}

func newPKI(dir string) *pki {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kubelock-faults-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	must(err)
	cert, err := x509.ParseCertificate(der)
	must(err)
	p := &pki{dir: dir, cert: cert, key: key, caPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
	must(os.WriteFile(p.caPath(), p.caPEM, 0o644))
	return p
}

func (p *pki) caPath() string { return filepath.Join(p.dir, "ca.crt") }

var serial int64 = 1

func (p *pki) issue(cn string, orgs []string, server bool) (certPEM, keyPEM []byte) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(err)
	serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		tmpl.DNSNames = []string{"localhost"}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.cert, &key.PublicKey, p.key)
	must(err)
	kder, err := x509.MarshalECPrivateKey(key)
	must(err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// servingPair writes a serving certificate for 127.0.0.1 as dir/tls.crt and dir/tls.key.
func (p *pki) servingPair(dir string) (certPath, keyPath string) {
	c, k := p.issue("127.0.0.1", nil, true)
	must(os.MkdirAll(dir, 0o755))
	certPath, keyPath = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	must(os.WriteFile(certPath, c, 0o644))
	must(os.WriteFile(keyPath, k, 0o600))
	return certPath, keyPath
}

// serviceAccountKey writes an RSA key for the apiserver's service-account tokens.
func (p *pki) serviceAccountKey() string {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	must(err)
	path := filepath.Join(p.dir, "sa.key")
	must(os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600))
	return path
}
