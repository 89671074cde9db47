package devenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"

	"github.com/kubelock/kubelock/internal/pki"
)

// loadOrCreateCA is the dev cluster's one certificate authority: it signs the
// apiserver's and the webhook's serving certificates and every user's client
// certificate (the apiserver trusts it as --client-ca-file). It reuses the CA
// in dir when reuse is set and it is there (so kubeconfigs survive a
// --persist restart), else creates a new one.
func loadOrCreateCA(dir string, reuse bool) (*pki.CA, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	crtPath, keyPath := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
	if reuse {
		if ca, err := pki.Load(crtPath, keyPath); err == nil {
			return ca, nil
		}
	}
	ca, err := pki.New("kubelock-dev-ca")
	if err != nil {
		return nil, err
	}
	if err := ca.Write(crtPath, keyPath); err != nil {
		return nil, err
	}
	return ca, nil
}

// writePair writes a certificate and key as crtName and keyName in dir and
// returns their paths.
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
	keyPEM, err := pki.EncodeKey(key)
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

func writeFile(path string, data []byte) error {
	return os.WriteFile(path, data, 0o600)
}
