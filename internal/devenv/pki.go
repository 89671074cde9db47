package devenv

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is the dev cluster's one certificate authority: it signs the
// apiserver's and the webhook's serving certificates and every user's client
// certificate (the apiserver trusts it as --client-ca-file).
type pki struct {
	dir    string
	caCert *x509.Certificate
	caKey  crypto.Signer
	caPEM  []byte
}

const certValidity = 365 * 24 * time.Hour

// loadOrCreatePKI reuses the CA in dir when reuse is set and it is there
// (so kubeconfigs survive a --persist restart), else creates a new one.
func loadOrCreatePKI(dir string, reuse bool) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	p := &pki{dir: dir}
	crtPath, keyPath := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
	if reuse {
		if pair, err := tls.LoadX509KeyPair(crtPath, keyPath); err == nil {
			c, err := x509.ParseCertificate(pair.Certificate[0])
			if err == nil && time.Now().Add(24*time.Hour).Before(c.NotAfter) {
				signer, ok := pair.PrivateKey.(crypto.Signer)
				if ok {
					p.caCert, p.caKey = c, signer
					p.caPEM, err = os.ReadFile(crtPath)
					return p, err
				}
			}
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "kubelock-dev-ca", Organization: []string{"kubelock"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(certValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	if p.caCert, err = x509.ParseCertificate(der); err != nil {
		return nil, err
	}
	p.caKey = key
	p.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, err
	}
	return p, errors.Join(writeFile(crtPath, p.caPEM), writeFile(keyPath, keyPEM))
}

// serving issues a serving certificate for 127.0.0.1 and localhost.
func (p *pki) serving(name string) (crt, key []byte, err error) {
	return p.issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: name},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	})
}

// client issues a client certificate: the apiserver reads the user name from
// the common name and the groups from the organizations.
func (p *pki) client(user string, groups ...string) (crt, key []byte, err error) {
	return p.issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: user, Organization: groups},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
}

func (p *pki) issue(tmpl *x509.Certificate) (crtPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl.SerialNumber = serial()
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = p.caCert.NotAfter
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, key.Public(), p.caKey)
	if err != nil {
		return nil, nil, err
	}
	if keyPEM, err = encodeKey(key); err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, nil
}

// writePair writes a certificate and key as name.crt and name.key (or, with
// tls set, as tls.crt and tls.key in the folder name) and returns their paths.
func writePair(dir, crtName, keyName string, crt, key []byte) (string, string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", err
	}
	c, k := filepath.Join(dir, crtName), filepath.Join(dir, keyName)
	return c, k, errors.Join(writeFile(c, crt), writeFile(k, key))
}

// serviceAccountKeys writes the key pair the apiserver signs service-account
// tokens with.
func serviceAccountKeys(dir string) (pub, priv string, err error) {
	pub, priv = filepath.Join(dir, "sa.pub"), filepath.Join(dir, "sa.key")
	if _, err1 := os.Stat(pub); err1 == nil {
		if _, err2 := os.Stat(priv); err2 == nil {
			return pub, priv, nil
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return "", "", err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return "", "", err
	}
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
	return pub, priv, errors.Join(writeFile(pub, pubPEM), writeFile(priv, keyPEM))
}

func encodeKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encoding a key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		return big.NewInt(time.Now().UnixNano())
	}
	return n
}

func writeFile(path string, data []byte) error {
	return os.WriteFile(path, data, 0o600)
}
