package localcluster

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/rest"

	"github.com/kubelock/kubelock/internal/proc"
)

// The Service network: the first address is the kubernetes Service's, which
// a node's pods reach the apiserver at.
const (
	ServiceCIDR = "10.0.0.0/24"
	ServiceIP   = "10.0.0.1"
)

// APIServer is one kube-apiserver on the cluster's etcd.
type APIServer struct {
	*Component
	// Port is its secure port; URL is https://127.0.0.1:Port.
	Port int
	URL  string
}

// newAPIServer lays out apiserver i of o (named kube-apiserver when alone,
// else kube-apiserver0, kube-apiserver1...) with its serving certificate.
func (c *Cluster) newAPIServer(i int) (*APIServer, error) {
	o := &c.o
	name := "kube-apiserver"
	if o.APIServers > 1 {
		name = fmt.Sprintf("kube-apiserver%d", i)
	}
	port := 0
	if i < len(o.APIServerPorts) {
		port = o.APIServerPorts[i]
	} else {
		var err error
		if port, err = proc.FreePort(); err != nil {
			return nil, err
		}
	}
	a := &APIServer{
		Component: &Component{Name: name, Path: filepath.Join(o.AssetsDir, "kube-apiserver"), LogPath: filepath.Join(o.LogDir, name+".log"),
			Readiness: "ready", StartTimeout: o.StartTimeout},
		Port: port,
		URL:  fmt.Sprintf("https://127.0.0.1:%d", port),
	}
	a.Ready = c.readyz(a.URL)
	return a, nil
}

// apiserverFlags are every apiserver's flags but its own port and certificate.
func (c *Cluster) apiserverFlags() ([]string, error) {
	o := &c.o
	saKey, err := serviceAccountKey(c.pkiDir)
	if err != nil {
		return nil, err
	}
	webhookClient := filepath.Join(c.pkiDir, "webhook-client")
	wca, err := loadOrCreateCA(webhookClient, o.Name+"-webhook-client-ca", o.Persist)
	if err != nil {
		return nil, err
	}
	admission, err := wca.WebhookClientConfig(webhookClient)
	if err != nil {
		return nil, err
	}
	c.WebhookClientCA, c.WebhookClientCAFile = wca.PEM, filepath.Join(webhookClient, "ca.crt")
	authz := "RBAC"
	if o.NodeIP != "" {
		authz = "Node,RBAC"
	}
	f := []string{
		"--etcd-servers=" + strings.Join(c.Etcd.Endpoints(), ","),
		"--client-ca-file=" + c.CAFile(),
		"--service-account-issuer=" + c.URL(),
		"--service-account-key-file=" + saKey, "--service-account-signing-key-file=" + saKey,
		"--service-cluster-ip-range=" + ServiceCIDR,
		"--authorization-mode=" + authz,
		"--allow-privileged=true",
		"--admission-control-config-file=" + admission, // a client certificate for webhooks
	}
	if o.APIServers > 1 {
		// One Service endpoint per address, and they all share 127.0.0.1.
		f = append(f, "--endpoint-reconciler-type=none")
	}
	if o.Aggregation {
		agg, err := frontProxyFlags(filepath.Join(c.pkiDir, "front-proxy"), o.Name+"-front-proxy-ca")
		if err != nil {
			return nil, err
		}
		f = append(f, agg...)
	}
	if o.NodeIP != "" {
		kubelet, err := c.kubeletClientFlags()
		if err != nil {
			return nil, err
		}
		f = append(f, kubelet...)
	}
	return f, nil
}

// kubeletClientFlags let the apiserver reach the node's kubelet (logs, exec)
// as system:masters, by a client certificate the kubelet authenticates.
func (c *Cluster) kubeletClientFlags() ([]string, error) {
	crt, key, err := c.CA.Client("kube-apiserver-kubelet-client", "system:masters")
	if err != nil {
		return nil, err
	}
	crtPath, keyPath, err := writePair(c.pkiDir, "apiserver-kubelet-client.crt", "apiserver-kubelet-client.key", crt, key)
	if err != nil {
		return nil, err
	}
	return []string{"--advertise-address=" + c.o.NodeIP,
		"--kubelet-client-certificate=" + crtPath, "--kubelet-client-key=" + keyPath,
		"--kubelet-preferred-address-types=InternalIP"}, nil
}

// configure writes the apiserver's serving certificate and sets its command
// line: common are the cluster's flags.
func (a *APIServer) configure(c *Cluster, common []string) error {
	// With a node, pods reach the apiserver through the kubernetes Service
	// (ServiceIP, forwarded to the node IP), so it listens there too.
	bind, hosts := "127.0.0.1", []string(nil)
	if ip := c.o.NodeIP; ip != "" {
		bind, hosts = "0.0.0.0", []string{ServiceIP, ip, "kubernetes.default.svc"}
	}
	certDir := filepath.Join(c.pkiDir, a.Name)
	crt, key, err := c.WriteServingCert(certDir, "kube-apiserver", hosts...)
	if err != nil {
		return err
	}
	own := []string{
		"--bind-address=" + bind,
		"--secure-port=" + strconv.Itoa(a.Port),
		"--tls-cert-file=" + crt, "--tls-private-key-file=" + key,
		"--cert-dir=" + certDir,
	}
	a.Args = withFlags(append(own, common...), c.o.APIServerArgs)
	return nil
}

// readyz is an apiserver's readiness check at url: /readyz as the
// administrator (etcd and the post-start hooks included).
func (c *Cluster) readyz(url string) func(context.Context) error {
	return func(ctx context.Context) error {
		tlsCfg, err := rest.TLSConfigFor(c.admin)
		if err != nil {
			return err
		}
		hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsCfg}}
		defer hc.CloseIdleConnections()
		_, err = proc.GetOK(ctx, hc, url+"/readyz")
		return err
	}
}
