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

	"github.com/kubelock/kubelock/internal/pki"
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

	own []string // its entry of Options.APIServerEachArgs
}

// newAPIServer lays out apiserver i of o: named kube-apiserver when alone,
// else kube-apiserver0, kube-apiserver1..., on its port of o or a free one.
func newAPIServer(o *Options, i int) (*APIServer, error) {
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
	if i < len(o.APIServerEachArgs) {
		a.own = o.APIServerEachArgs[i]
	}
	return a, nil
}

// apiserverFlags are the flags every apiserver of the cluster shares: its
// etcd, the CA, the service accounts' key and issuer, the admission
// configuration that presents webhookClient's certificate to webhooks, and
// the options' aggregation layer and node.
func apiserverFlags(o *Options, auth *authority, etcd *Etcd, saKey, issuer, admission string) ([]string, error) {
	authz := "RBAC"
	if o.NodeIP != "" {
		authz = "Node,RBAC"
	}
	f := []string{
		"--etcd-servers=" + strings.Join(etcd.Endpoints(), ","),
		"--client-ca-file=" + auth.caFile(),
		"--service-account-issuer=" + issuer,
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
		agg, err := frontProxyFlags(filepath.Join(auth.dir, "front-proxy"), o.Name+"-front-proxy-ca")
		if err != nil {
			return nil, err
		}
		f = append(f, agg...)
	}
	if o.NodeIP != "" {
		kubelet, err := kubeletClientFlags(auth, o.NodeIP)
		if err != nil {
			return nil, err
		}
		f = append(f, kubelet...)
	}
	return f, nil
}

// webhookClientAuth is the CA of the client certificate the apiservers
// present to admission webhooks, kept in dir, and the
// --admission-control-config-file that presents it.
func webhookClientAuth(dir, name string, reuse bool) (*pki.CA, string, error) {
	ca, err := loadOrCreateCA(dir, name, reuse)
	if err != nil {
		return nil, "", err
	}
	admission, err := ca.WebhookClientConfig(dir)
	return ca, admission, err
}

// kubeletClientFlags let the apiserver reach the node's kubelet (logs, exec)
// as system:masters, by a client certificate the kubelet authenticates.
func kubeletClientFlags(auth *authority, nodeIP string) ([]string, error) {
	crt, key, err := auth.ca.Client("kube-apiserver-kubelet-client", "system:masters")
	if err != nil {
		return nil, err
	}
	crtPath, keyPath, err := writePair(auth.dir, "apiserver-kubelet-client.crt", "apiserver-kubelet-client.key", crt, key)
	if err != nil {
		return nil, err
	}
	return []string{"--advertise-address=" + nodeIP,
		"--kubelet-client-certificate=" + crtPath, "--kubelet-client-key=" + keyPath,
		"--kubelet-preferred-address-types=InternalIP"}, nil
}

// configure writes the apiserver's serving certificate and sets its command
// line (common are the cluster's flags) and its readiness check, made as
// admin.
func (a *APIServer) configure(o *Options, auth *authority, common []string, admin *rest.Config) error {
	// With a node, pods reach the apiserver through the kubernetes Service
	// (ServiceIP, forwarded to the node IP), so it listens there too.
	bind, hosts := "127.0.0.1", []string(nil)
	if o.NodeIP != "" {
		bind, hosts = "0.0.0.0", []string{ServiceIP, o.NodeIP, "kubernetes.default.svc"}
	}
	certDir := filepath.Join(auth.dir, a.Name)
	crt, key, err := auth.servingCert(certDir, "kube-apiserver", hosts...)
	if err != nil {
		return err
	}
	own := []string{
		"--bind-address=" + bind,
		"--secure-port=" + strconv.Itoa(a.Port),
		"--tls-cert-file=" + crt, "--tls-private-key-file=" + key,
		"--cert-dir=" + certDir,
	}
	a.Args = withFlags(withFlags(append(own, common...), o.APIServerArgs), a.own)
	a.Ready = readyz(a.URL, admin)
	return nil
}

// readyz is an apiserver's readiness check at url: /readyz as admin (etcd
// and the post-start hooks included).
func readyz(url string, admin *rest.Config) func(context.Context) error {
	return func(ctx context.Context) error {
		tlsCfg, err := rest.TLSConfigFor(admin)
		if err != nil {
			return err
		}
		hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsCfg}}
		defer hc.CloseIdleConnections()
		_, err = proc.GetOK(ctx, hc, url+"/readyz")
		return err
	}
}
