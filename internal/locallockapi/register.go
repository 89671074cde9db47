package locallockapi

import (
	"context"
	"encoding/base64"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/internal/localcluster"
	"github.com/kubelock/kubelock/internal/lockbackend"
)

// Register points the APIService at s, through a Service of its own and an
// EndpointSlice with its address, and waits until kube-apiserver serves the
// lock API from it. It refuses while the lock CRDs are installed
// (lockbackend.Check): that would switch the cluster's backend.
func (s *Server) Register(ctx context.Context) error { return Register(ctx, s) }

// Register points the APIService at replicas of one server (Started with
// one Name, each in a folder of its own) behind one Service, as a
// Deployment's pods are: an EndpointSlice per replica (each listens on a
// port of its own) and a caBundle with each replica's CA. With
// --enable-aggregator-routing, kube-apiserver sends each request to a ready
// endpoint picked at random.
func Register(ctx context.Context, replicas ...*Server) error {
	s := replicas[0]
	cl, err := adminClient(s.cluster)
	if err != nil {
		return err
	}
	if err := lockbackend.Check(ctx, cl, lockbackend.APIServer); err != nil {
		return err
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: s.Name},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromInt(s.Port)}}},
	}
	if err := cl.Create(ctx, svc); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	var bundle []byte
	for i, r := range replicas {
		r.slice = r.Name
		if i > 0 {
			r.slice = fmt.Sprintf("%s-%d", r.Name, i)
		}
		if err := r.point(ctx, cl, true); err != nil {
			return err
		}
		bundle = append(bundle, r.CA...)
	}
	// Unstructured: client-go's scheme does not know apiregistration.
	as := apiService()
	spec := map[string]any{
		"group": locksv1alpha1.GroupVersion.Group, "version": locksv1alpha1.GroupVersion.Version,
		"service":              map[string]any{"namespace": Namespace, "name": s.Name, "port": int64(443)},
		"caBundle":             base64.StdEncoding.EncodeToString(bundle),
		"groupPriorityMinimum": int64(1000),
		"versionPriority":      int64(15),
	}
	switch err := cl.Get(ctx, client.ObjectKeyFromObject(as), as); {
	case apierrors.IsNotFound(err):
		as.Object["spec"] = spec
		if err := cl.Create(ctx, as); err != nil {
			return err
		}
	case err != nil:
		return err
	default:
		as.Object["spec"] = spec
		if err := cl.Update(ctx, as); err != nil {
			return err
		}
	}
	return s.APIServer.WaitFor(ctx, "served through kube-apiserver", s.timeout, func(ctx context.Context) error {
		return s.serves(ctx, cl)
	})
}

// SetReady marks the replica's endpoint ready or not, as the EndpointSlice
// controller does when its pod's readiness probe passes or fails:
// kube-apiserver sends requests only to ready endpoints.
func (s *Server) SetReady(ctx context.Context, ready bool) error {
	cl, err := adminClient(s.cluster)
	if err != nil {
		return err
	}
	return s.point(ctx, cl, ready)
}

// point makes s's EndpointSlice in the Service name its address and port,
// which change at every start, ready or not.
func (s *Server) point(ctx context.Context, cl client.Client, ready bool) error {
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: s.slice,
			Labels: map[string]string{discoveryv1.LabelServiceName: s.Name, discoveryv1.LabelManagedBy: "kubelock-local"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{s.Host}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To(int32(s.Port)), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	err := cl.Create(ctx, slice)
	if apierrors.IsAlreadyExists(err) {
		old := &discoveryv1.EndpointSlice{}
		if err := cl.Get(ctx, client.ObjectKeyFromObject(slice), old); err != nil {
			return err
		}
		slice.ResourceVersion = old.ResourceVersion
		return cl.Update(ctx, slice)
	}
	return err
}

// serves checks that the APIService names s and is available.
func (s *Server) serves(ctx context.Context, cl client.Client) error {
	as := apiService()
	if err := cl.Get(ctx, client.ObjectKeyFromObject(as), as); err != nil {
		return err
	}
	if name, _, _ := unstructured.NestedString(as.Object, "spec", "service", "name"); name != s.Name {
		return fmt.Errorf("the APIService names service %q", name)
	}
	conditions, _, _ := unstructured.NestedSlice(as.Object, "status", "conditions")
	for _, c := range conditions {
		if c, ok := c.(map[string]any); ok && c["type"] == "Available" && c["status"] == "True" {
			return nil
		}
	}
	return fmt.Errorf("the APIService is not available yet: %v", conditions)
}

func apiService() *unstructured.Unstructured {
	as := &unstructured.Unstructured{}
	as.SetAPIVersion("apiregistration.k8s.io/v1")
	as.SetKind("APIService")
	as.SetName(APIServiceName)
	return as
}

// adminClient is a client of cluster's kube-apiserver as its administrator.
func adminClient(cluster *localcluster.Cluster) (client.Client, error) {
	return client.New(cluster.AdminConfig(), client.Options{Scheme: clientgoscheme.Scheme})
}

// FlowControlRules are what kubelock-apiserver's priority and fairness needs
// of kube-apiserver: the cluster's FlowSchemas and priority levels, and their
// FlowSchemas' status, where it marks one whose priority level is missing (the
// chart's ClusterRole kubelock-apiserver-flow-control grants the same).
var FlowControlRules = []rbacv1.PolicyRule{
	{APIGroups: []string{"flowcontrol.apiserver.k8s.io"}, Resources: []string{"flowschemas", "prioritylevelconfigurations"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{"flowcontrol.apiserver.k8s.io"}, Resources: []string{"flowschemas/status"}, Verbs: []string{"patch"}},
}

// ensureAccess creates the namespace and lets User do what a delegating API
// server does (TokenReviews and SubjectAccessReviews, and reading the
// authentication ConfigMap in kube-system) and what its start's backend
// check reads (lockbackend.CheckRules), and read the cluster's priority and fairness
// configuration (FlowControlRules).
func ensureAccess(ctx context.Context, cluster *localcluster.Cluster) error {
	cl, err := adminClient(cluster)
	if err != nil {
		return err
	}
	subject := []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: User}}
	checker, flowControl := User+":backend-check", User+":flow-control"
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: User + ":auth-delegator"}, Subjects: subject,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:auth-delegator"}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: User + ":authentication-reader"}, Subjects: subject,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "extension-apiserver-authentication-reader"}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: checker}, Rules: lockbackend.CheckRules},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: checker}, Subjects: subject,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: checker}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: flowControl}, Rules: FlowControlRules},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: flowControl}, Subjects: subject,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: flowControl}},
	} {
		if err := cl.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	return nil
}
