package localcluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/kubelock/kubelock/internal/pki"
)

// frontProxyUser is the common name of kube-apiserver's proxy client
// certificate (aggregation): the one name its request headers are believed from.
const frontProxyUser = "front-proxy-client"

// loadOrCreateCA is a certificate authority kept as dir/ca.crt and
// dir/ca.key: the one there when reuse is set and it is valid (so
// kubeconfigs survive a restart that keeps the data), else a new one.
func loadOrCreateCA(dir, name string, reuse bool) (*pki.CA, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	crtPath, keyPath := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
	if reuse {
		if ca, err := pki.Load(crtPath, keyPath); err == nil {
			return ca, nil
		}
	}
	ca, err := pki.New(name)
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

// serviceAccountKey writes the key kube-apiserver signs service-account
// tokens with and checks them with (it reads the public key from the
// private one), unless it is there already; kube-controller-manager signs
// the legacy token Secrets with it.
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

// frontProxyFlags are the flags of the aggregation layer: kube-apiserver
// proxies an APIService's requests with a client certificate of a CA of its
// own (written into dir), the user in X-Remote-* headers, to the
// APIService's endpoints rather than its Service's cluster IP.
func frontProxyFlags(dir, name string) ([]string, error) {
	ca, err := loadOrCreateCA(dir, name, false)
	if err != nil {
		return nil, err
	}
	crt, key, err := ca.Client(frontProxyUser)
	if err != nil {
		return nil, err
	}
	crtPath, keyPath, err := writePair(dir, "proxy-client.crt", "proxy-client.key", crt, key)
	if err != nil {
		return nil, err
	}
	return []string{
		"--requestheader-client-ca-file=" + filepath.Join(dir, "ca.crt"),
		"--requestheader-allowed-names=" + frontProxyUser,
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-uid-headers=X-Remote-Uid",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--proxy-client-cert-file=" + crtPath,
		"--proxy-client-key-file=" + keyPath,
		"--enable-aggregator-routing=true",
	}, nil
}

// authority is the cluster's pki folder and its CA, which signs every
// serving certificate and every user's client certificate.
type authority struct {
	dir string
	ca  *pki.CA
}

// caFile holds the CA's certificate.
func (a *authority) caFile() string { return filepath.Join(a.dir, "ca.crt") }

// userConfig is a connection to host as user in groups.
func (a *authority) userConfig(host, user string, groups ...string) (*rest.Config, error) {
	crt, key, err := a.ca.Client(user, groups...)
	if err != nil {
		return nil, err
	}
	return &rest.Config{Host: host, TLSClientConfig: rest.TLSClientConfig{CAData: a.ca.PEM, CertData: crt, KeyData: key}}, nil
}

// kubeconfig writes a kubeconfig of user in groups for host as file in the
// pki folder and returns its path.
func (a *authority) kubeconfig(host, file, user string, groups ...string) (string, error) {
	cfg, err := a.userConfig(host, user, groups...)
	if err != nil {
		return "", err
	}
	path := filepath.Join(a.dir, file)
	return path, WriteKubeconfig(path, cfg)
}

// servingCert writes a serving certificate for 127.0.0.1, localhost and
// hosts as dir/tls.crt and dir/tls.key and returns their paths.
func (a *authority) servingCert(dir, name string, hosts ...string) (crtPath, keyPath string, err error) {
	crt, key, err := a.ca.Serving(name, hosts...)
	if err != nil {
		return "", "", err
	}
	return writePair(dir, "tls.crt", "tls.key", crt, key)
}

// WriteKubeconfig writes cfg (its server, CA and client certificate or
// token) as a kubeconfig file at path.
func WriteKubeconfig(path string, cfg *rest.Config) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["local"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["user"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: "user"}
	kc.CurrentContext = "local"
	return clientcmd.WriteToFile(*kc, path)
}

func writeFile(path string, data []byte) error {
	return os.WriteFile(path, data, 0o600)
}
