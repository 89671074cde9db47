package devenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
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

// serviceAccountKey writes the key the apiserver signs service-account tokens
// with, and checks them with (it reads the public key from the private one).
func serviceAccountKey(dir string) (string, error) {
	path := filepath.Join(dir, "sa.key")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", err
	}
	keyPEM, err := pki.EncodeKey(key)
	if err != nil {
		return "", err
	}
	return path, writeFile(path, keyPEM)
}

func writeFile(path string, data []byte) error {
	return os.WriteFile(path, data, 0o600)
}
