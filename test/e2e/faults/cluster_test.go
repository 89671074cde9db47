//go:build faults

package faults

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/internal/manager"
	"github.com/kubelock/kubelock/internal/pki"
	"github.com/kubelock/kubelock/internal/proc"
	"github.com/kubelock/kubelock/test/testenv"
)

const (
	controllerUser = "kubelock-controller"
	clientUser     = "faults-client"
	operatorNS     = "kubelock-system"
	lockUserRole   = "kubelock-faults-lock-user"
)

// etcdMember is one member of the three-member etcd cluster.
type etcdMember struct {
	*process
	clientURL string
}

// controlPlane is three etcd members on loopback behind one kube-apiserver.
type controlPlane struct {
	ca        *pki.CA
	caFile    string
	etcd      []*etcdMember
	apiserver *process
	host      string
	admin     *rest.Config
	// saKey signs service-account tokens (the apiserver's and the controller-manager's).
	saKey string
	// kcm is kube-controller-manager (garbage collector, namespace, service-account and
	// quota controllers), started once the apiserver is ready.
	kcm *proc.Child
}

func startControlPlane(dir string) *controlPlane {
	assets := testenv.AssetsDir()
	cp := &controlPlane{}
	cp.ca, cp.caFile = newCA(dir)
	var peers []string
	type ports struct{ client, peer int }
	ps := make([]ports, 3)
	for i := range ps {
		ps[i] = ports{freePort(), freePort()}
		peers = append(peers, fmt.Sprintf("etcd%d=http://127.0.0.1:%d", i, ps[i].peer))
	}
	var clientURLs []string
	for i, p := range ps {
		name := fmt.Sprintf("etcd%d", i)
		curl, purl := fmt.Sprintf("http://127.0.0.1:%d", p.client), fmt.Sprintf("http://127.0.0.1:%d", p.peer)
		m := &etcdMember{process: newProcess(name, filepath.Join(assets, "etcd"),
			"--name="+name, "--data-dir="+filepath.Join(dir, name),
			"--listen-client-urls="+curl, "--advertise-client-urls="+curl,
			"--listen-peer-urls="+purl, "--initial-advertise-peer-urls="+purl,
			"--initial-cluster="+strings.Join(peers, ","), "--initial-cluster-state=new", "--initial-cluster-token=kubelock-faults",
			"--unsafe-no-fsync", "--log-level=warn"), clientURL: curl}
		must(m.start())
		cp.etcd = append(cp.etcd, m)
		clientURLs = append(clientURLs, curl)
	}
	port := freePort()
	cp.host = fmt.Sprintf("https://127.0.0.1:%d", port)
	crt, key := servingPair(cp.ca, filepath.Join(dir, "apiserver"))
	cp.saKey = serviceAccountKey(dir)
	sa := cp.saKey
	cp.apiserver = newProcess("kube-apiserver", filepath.Join(assets, "kube-apiserver"),
		"--etcd-servers="+strings.Join(clientURLs, ","),
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none", fmt.Sprintf("--secure-port=%d", port),
		"--tls-cert-file="+crt, "--tls-private-key-file="+key, "--client-ca-file="+cp.caFile,
		"--cert-dir="+filepath.Join(dir, "apiserver"),
		"--service-account-issuer="+cp.host+"/", "--service-account-key-file="+sa, "--service-account-signing-key-file="+sa,
		"--service-cluster-ip-range=10.0.0.0/24",
		"--authorization-mode=RBAC", "--allow-privileged=true")
	must(cp.apiserver.start())
	cp.admin = cp.userConfig("kubelock-faults-admin", "system:masters")
	return cp
}

// startControllerManager starts kube-controller-manager once the apiserver is ready.
func (cp *controlPlane) startControllerManager(ctx context.Context, dir string) error {
	kc := kubeconfig(filepath.Join(dir, "kcm.kubeconfig"), cp.userConfig("system:kube-controller-manager", "system:masters"))
	var err error
	cp.kcm, err = proc.StartControllerManager(ctx, filepath.Join(testenv.AssetsDir(), "kube-controller-manager"),
		filepath.Join(dir, "kube-controller-manager.log"), kc, cp.saKey, time.Minute)
	return err
}

// stop stops kube-controller-manager, then the apiserver, then etcd.
func (cp *controlPlane) stop() {
	if cp.kcm != nil {
		_ = cp.kcm.Stop(20 * time.Second)
	}
	cp.apiserver.stop()
	for _, m := range cp.etcd {
		m.stop()
	}
}

// userConfig is a connection as name (a client certificate of the suite's CA).
func (cp *controlPlane) userConfig(name string, groups ...string) *rest.Config {
	c, k, err := cp.ca.Client(name, groups...)
	must(err)
	return &rest.Config{Host: cp.host, QPS: -1, TLSClientConfig: rest.TLSClientConfig{CAData: cp.ca.PEM, CertData: c, KeyData: k}}
}

// kubeconfig writes cfg as a kubeconfig file.
func kubeconfig(path string, cfg *rest.Config) string {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	kc.CurrentContext = "c"
	must(clientcmd.WriteToFile(*kc, path))
	return path
}

// ready waits until the apiserver answers /readyz (etcd included).
func (cp *controlPlane) ready(ctx context.Context) error {
	rt, err := rest.TransportFor(cp.admin)
	if err != nil {
		return err
	}
	hc := &http.Client{Transport: rt, Timeout: 2 * time.Second}
	var last error
	for ctx.Err() == nil {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, cp.host+"/readyz", nil)
		resp, err := hc.Do(req)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("readyz: %s", resp.Status)
		}
		last = err
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("apiserver not ready: %w", last)
}

// install puts the CRDs, the operator's namespace, the lock-user RBAC and the
// webhook configuration from config/webhook (pointed at webhookURL) in place.
func (cp *controlPlane) install(ctx context.Context, c client.Client, webhookURL string) error {
	root := testenv.RepoRoot()
	if _, err := envtest.InstallCRDs(cp.admin, envtest.CRDInstallOptions{Paths: []string{filepath.Join(root, "config", "crd", "bases")}, ErrorIfPathMissing: true}); err != nil {
		return err
	}
	objs := []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: operatorNS}},
		&rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: lockUserRole},
			Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{locksv1alpha1.GroupVersion.Group}, Resources: []string{"distributedlocks"}, Verbs: []string{"get", "list", "watch", "create"}},
				{APIGroups: []string{locksv1alpha1.GroupVersion.Group}, Resources: []string{"distributedlocks/status"}, Verbs: []string{"get", "update", "patch"}},
				{APIGroups: []string{locksv1alpha1.GroupVersion.Group}, Resources: []string{locksv1alpha1.LockSessionsResource}, Verbs: []string{"get", "list", "watch", "create", "delete"}},
				{APIGroups: []string{locksv1alpha1.GroupVersion.Group}, Resources: []string{locksv1alpha1.LockSessionsResource + "/status"}, Verbs: []string{"get", "update", "patch"}},
				{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"selfsubjectreviews"}, Verbs: []string{"create"}},
			},
		},
		&rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: lockUserRole},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: lockUserRole},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: clientUser}},
		},
	}
	b, err := os.ReadFile(filepath.Join(root, "config", "webhook", "manifests.yaml"))
	if err != nil {
		return err
	}
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := yaml.Unmarshal(b, vwc); err != nil {
		return err
	}
	vwc.Name = "kubelock-validating-webhook-configuration"
	for i := range vwc.Webhooks {
		cc := &vwc.Webhooks[i].ClientConfig
		url := webhookURL + *cc.Service.Path
		cc.Service, cc.URL, cc.CABundle = nil, &url, cp.ca.PEM
	}
	objs = append(objs, vwc)
	for _, o := range objs {
		if err := c.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating %T %s: %w", o, o.GetName(), err)
		}
	}
	return nil
}

// managerProcess is one replica of the operator.
func newManager(name, bin, kubeconfigPath, certDir, offsetFile string) (*process, int) {
	probe, wh := freePort(), freePort()
	p := newProcess(name, bin,
		"--kubeconfig="+kubeconfigPath,
		"--leader-elect", "--leader-election-namespace="+operatorNS, "--leader-election-id=kubelock-faults",
		"--metrics-bind-address=0", fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", probe),
		fmt.Sprintf("--webhook-port=%d", wh), "--webhook-cert-dir="+certDir, "--cert-rotation=false",
		"--controller-username="+controllerUser, "--webhook-controller-users="+controllerUser,
	)
	p.env = []string{manager.WallClockOffsetFileEnv + "=" + offsetFile}
	return p, wh
}
