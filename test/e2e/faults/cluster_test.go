//go:build faults

package faults

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/cmd/manager/operator"
	"github.com/kubelock/kubelock/internal/localcluster"
	"github.com/kubelock/kubelock/test/testenv"
)

const (
	controllerUser = "kubelock-controller"
	clientUser     = "faults-client"
	operatorNS     = "kubelock-system"
	lockUserRole   = "kubelock-faults-lock-user"
	electionSA     = "kubelock-leader-election"
)

// controlPlane is three etcd members on loopback behind one kube-apiserver,
// with kube-controller-manager (garbage collector, namespace, service-account
// and quota controllers).
type controlPlane struct {
	*localcluster.Cluster
	admin *rest.Config
}

func startControlPlane(ctx context.Context, dir string) (*controlPlane, error) {
	c, err := localcluster.Start(ctx, localcluster.Options{
		Name: "kubelock-faults", Dir: dir, LogDir: dir, AssetsDir: testenv.AssetsDir(),
		Admin:         "kubelock-faults-admin",
		EtcdMembers:   3,
		APIServerArgs: []string{"--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none"},
		// Scenarios wait for a restarted member or apiserver under load.
		StartControllerManager: true, StartTimeout: 3 * time.Minute,
	})
	if err != nil {
		return nil, err
	}
	cp := &controlPlane{Cluster: c, admin: c.AdminConfig()}
	cp.admin.QPS = -1
	return cp, nil
}

// userConfig is a connection as name (a client certificate of the suite's CA).
func (cp *controlPlane) userConfig(name string, groups ...string) *rest.Config {
	cfg, err := cp.UserConfig(name, groups...)
	must(err)
	cfg.QPS = -1
	return cfg
}

// ready waits until the apiserver answers /readyz (etcd included).
func (cp *controlPlane) ready(ctx context.Context) error { return cp.APIServer().WaitReady(ctx) }

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
		// The replicas elect their leader on a DistributedLock, as the
		// chart's default has them, campaigning as this service account.
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: operatorNS, Name: electionSA}},
		&rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: operatorNS, Name: electionSA},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: lockUserRole},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: operatorNS, Name: electionSA}},
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
		cc.Service, cc.URL, cc.CABundle = nil, &url, cp.CA.PEM
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
		// Failover timelines (failover_test.go) read the log's times.
		"--zap-time-encoding=rfc3339nano",
	)
	p.args = append(p.args, electionArgs()...)
	p.env = []string{operator.WallClockOffsetFileEnv + "=" + offsetFile}
	return p, wh
}

// electionArgs are the replicas' election flags FAULTS_ELECTION asks for:
// none for controller-runtime's Lease (the chart's default), or a
// DistributedLock campaigned on as electionSA with short timings, which
// kubelock's election may use safely (a leader stops before its holding can
// expire).
func electionArgs() []string {
	if os.Getenv("FAULTS_ELECTION") != operator.ElectOnKubelock {
		return nil
	}
	return []string{
		"--leader-election-lock=" + operator.ElectOnKubelock, "--leader-election-service-account=" + electionSA,
		"--leader-election-lease-duration=6s", "--leader-election-renew-deadline=3s", "--leader-election-retry-period=1s",
	}
}
