package devenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"path"
	"strconv"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/cmd/manager/operator"
	kubelockconfig "github.com/kubelock/kubelock/config"
	"github.com/kubelock/kubelock/rules"
)

const (
	// DemoLock is the sample lock created in namespace default.
	DemoLock = "demo"
	// WebhookConfigName is the name config/default gives the webhook configuration.
	WebhookConfigName = "kubelock-validating-webhook-configuration"
	// FencedWebhookConfigName is the name config/fenced-objects gives its webhook configuration.
	FencedWebhookConfigName = "kubelock-fenced-objects"
	lockUserRole            = "kubelock-lock-user"
	breakglassRole          = "kubelock-breakglass"
)

func (e *env) client() (client.Client, error) {
	scheme, err := operator.Scheme()
	if err != nil {
		return nil, err
	}
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	return client.New(e.admin, client.Options{Scheme: scheme})
}

// install puts in the CRDs (on the CRD backend), the lock-user and
// break-glass ClusterRoles, the users' bindings, the sample lock-user RBAC
// and (on the CRD backend) the demo lock.
func (e *env) install(ctx context.Context) error {
	c, err := e.client()
	if err != nil {
		return err
	}
	served := "the lock API from kubelock-apiserver"
	if e.o.Backend == BackendCRD {
		if err := e.installCRDs(ctx, c); err != nil {
			return err
		}
		served = "the DistributedLock CRD"
	}

	roles, err := readObjects("rbac/lock_user_role.yaml", "rbac/breakglass_role.yaml")
	if err != nil {
		return err
	}
	for _, r := range roles {
		if err := apply(ctx, c, r); err != nil {
			return fmt.Errorf("installing ClusterRole %s: %w", r.GetName(), err)
		}
	}
	users := append(append([]string(nil), LockUsers...), BreakglassUser)
	for _, b := range []struct {
		name, role string
		users      []string
	}{
		{"kubelock-dev-lock-users", lockUserRole, users},
		{"kubelock-dev-breakglass", breakglassRole, []string{BreakglassUser}},
	} {
		rb := &rbacv1.RoleBinding{
			TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"},
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: b.name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: b.role},
		}
		for _, u := range b.users {
			rb.Subjects = append(rb.Subjects, rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: u})
		}
		u, err := toUnstructured(rb)
		if err != nil {
			return err
		}
		if err := apply(ctx, c, u); err != nil {
			return fmt.Errorf("binding %s: %w", b.role, err)
		}
	}

	// The sample lock-user RBAC, as `kubectl apply -k config/samples/` creates
	// it: with kubectl's record of what it applied, so that the next step's
	// apply of the same file changes nothing (and does not warn that the
	// record is missing).
	samples, err := readObjects("samples/lock_user_rbac.yaml")
	if err != nil {
		return err
	}
	for _, s := range samples {
		if err := recordLastApplied(s); err != nil {
			return err
		}
		if err := apply(ctx, c, s); err != nil {
			return fmt.Errorf("creating sample %s %s: %w", s.GetKind(), s.GetName(), err)
		}
	}

	if e.o.Backend == BackendAPIServer && e.o.Node {
		// Served once the chart's pods run: deployChart creates the demo lock.
		e.progress("installed lock users %s and the sample lock-user RBAC", strings.Join(users, ", "))
		return nil
	}
	if err := createDemoLock(ctx, c); err != nil {
		return err
	}
	e.progress("installed %s, lock users %s, the sample lock-user RBAC and lock default/%s", served, strings.Join(users, ", "), DemoLock)
	return nil
}

// installCRDs installs config/crd and waits until kube-apiserver serves them.
func (e *env) installCRDs(ctx context.Context, c client.Client) error {
	crds, err := readObjects("crd/bases/*.yaml")
	if err != nil {
		return err
	}
	for _, crd := range crds {
		if err := apply(ctx, c, crd); err != nil {
			return fmt.Errorf("installing CRD %s: %w", crd.GetName(), err)
		}
	}
	for _, crd := range crds {
		if err := waitEstablished(ctx, c, crd.GetName(), e.o.StartTimeout); err != nil {
			return err
		}
	}
	return nil
}

// createDemoLock creates the lock the next steps use.
func createDemoLock(ctx context.Context, c client.Client) error {
	demo := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{
		Namespace: "default", Name: DemoLock,
		Annotations: map[string]string{locksv1alpha1.KeyAnnotation: DemoLock},
	}}
	if err := c.Create(ctx, demo); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating lock default/%s: %w", DemoLock, err)
	}
	return nil
}

// The admission engines kubelock-dev starts, as the chart's admission.engine.
const (
	// AdmissionWebhook is the operator's validating webhook (config/webhook).
	AdmissionWebhook = "webhook"
	// AdmissionPolicy is config/policy's ValidatingAdmissionPolicies,
	// evaluated inside the apiserver; no webhook sees lock writes.
	AdmissionPolicy = "policy"
)

// What the apiserver's denial says first when the webhook denied a write, and
// when a ValidatingAdmissionPolicy did.
const (
	webhookDenial = "admission webhook"
	policyDenial  = "ValidatingAdmissionPolicy"
)

// registerAdmission starts the lock rules' engine: the webhook served by the
// in-process operator, or the policies.
func (e *env) registerAdmission(ctx context.Context) error {
	c, err := e.client()
	if err != nil {
		return err
	}
	if e.o.Backend == BackendAPIServer {
		return e.waitAdmission(ctx, c, lockAPIServerDenial, "kubelock-apiserver's rules")
	}
	if e.o.Admission == AdmissionPolicy {
		return e.registerPolicy(ctx, c, ControllerUser)
	}
	host, err := e.installWebhookConfig(ctx, c, "webhook/manifests.yaml", WebhookConfigName)
	if err != nil {
		return err
	}
	return e.waitAdmission(ctx, c, webhookDenial, "the admission webhook at "+host)
}

// registerPolicy applies config/policy's ValidatingAdmissionPolicies and their
// bindings, with controllerUser as the controller they let expire holdings,
// and returns once the apiserver enforces them.
func (e *env) registerPolicy(ctx context.Context, c client.Client, controllerUser string) error {
	objs, err := policyObjects(controllerUser)
	if err != nil {
		return err
	}
	for _, o := range objs {
		if err := apply(ctx, c, o); err != nil {
			return fmt.Errorf("applying %s %s: %w", o.GetKind(), o.GetName(), err)
		}
	}
	return e.waitAdmission(ctx, c, policyDenial, "the ValidatingAdmissionPolicies of config/policy")
}

// policyObjects are config/policy's policies and bindings, each policy's
// controllerUser variable (the first, by config/policy's convention)
// replaced by controllerUser, as an overlay for another controller account
// does.
func policyObjects(controllerUser string) ([]*unstructured.Unstructured, error) {
	all, err := readObjects("policy/*.yaml")
	if err != nil {
		return nil, err
	}
	var out []*unstructured.Unstructured
	for _, o := range all {
		switch o.GetKind() {
		case "ValidatingAdmissionPolicy":
			if err := setControllerUser(o, controllerUser); err != nil {
				return nil, err
			}
		case "ValidatingAdmissionPolicyBinding":
		default:
			continue // the kustomization
		}
		out = append(out, o)
	}
	return out, nil
}

// setControllerUser sets a policy's controllerUser variable, if it has one.
func setControllerUser(policy *unstructured.Unstructured, user string) error {
	vars, _, err := unstructured.NestedSlice(policy.Object, "spec", "variables")
	if err != nil {
		return err
	}
	if len(vars) == 0 {
		return nil
	}
	first, ok := vars[0].(map[string]any)
	if !ok || first["name"] != "controllerUser" {
		return nil
	}
	first["expression"] = strconv.Quote(user)
	return unstructured.SetNestedSlice(policy.Object, vars, "spec", "variables")
}

// waitAdmission returns once the apiserver enforces the lock rules with the
// engine whose denials contain deniedBy: a dry-run write both engines must
// deny is denied by it. what names the engine in the error.
func (e *env) waitAdmission(ctx context.Context, c client.Client, deniedBy, what string) error {
	// A waiter written in someone else's name passes the CRD's rules and
	// is denied by either engine ([kubelock:identity]).
	var last error
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, e.o.StartTimeout, true, func(ctx context.Context) (bool, error) {
		l := &locksv1alpha1.DistributedLock{}
		if last = c.Get(ctx, client.ObjectKey{Namespace: "default", Name: DemoLock}, l); last == nil {
			now := metav1.NowMicro()
			l.Status.Waiters = append(l.Status.Waiters, locksv1alpha1.Waiter{
				Identity: "kubelock-dev-probe", User: "kubelock-dev-probe", RequestID: "kubelock-dev-probe",
				EnqueueTime: now, Deadline: metav1.NewMicroTime(now.Add(time.Minute)),
			})
			l.Status.WaiterCount = int32(len(l.Status.Waiters))
			if last = c.Status().Update(ctx, l, client.DryRunAll); last == nil {
				last = errors.New("a write the webhook must deny was admitted")
			}
		}
		return strings.Contains(last.Error(), deniedBy) && strings.Contains(last.Error(), "[kubelock:"), nil
	})
	if err != nil {
		return fmt.Errorf("the apiserver does not enforce %s: %w (operator log: %s)", what, last, e.operatorLog)
	}
	e.progress("admission: %s enforced", what)
	return nil
}

// installWebhookConfig installs the embedded webhook configuration file as
// name, every webhook pointed at the operator on 127.0.0.1 with the dev CA,
// and returns that address.
func (e *env) installWebhookConfig(ctx context.Context, c client.Client, file, name string) (string, error) {
	data, err := kubelockconfig.FS.ReadFile(file)
	if err != nil {
		return "", err
	}
	var vwc admissionregistrationv1.ValidatingWebhookConfiguration
	if err := yaml.Unmarshal(data, &vwc); err != nil {
		return "", fmt.Errorf("reading the webhook configuration %s: %w", file, err)
	}
	vwc.Name, vwc.Annotations = name, nil // no cert-manager here
	host := "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(e.o.WebhookPort))
	for i := range vwc.Webhooks {
		cc := &vwc.Webhooks[i].ClientConfig
		p := "/"
		if cc.Service != nil && cc.Service.Path != nil {
			p = *cc.Service.Path
		}
		url := host + p
		cc.Service, cc.URL, cc.CABundle = nil, &url, e.cluster.CA.PEM
	}
	u, err := toUnstructured(&vwc)
	if err != nil {
		return "", err
	}
	if err := apply(ctx, c, u); err != nil {
		return "", fmt.Errorf("registering the webhook configuration %s: %w", name, err)
	}
	return host, nil
}

// registerFencedObjects installs config/fenced-objects for ConfigMaps (as
// FencedWebhookConfigName), lets the dev users write ConfigMaps in namespace
// default, and returns once the apiserver enforces it: a dry-run create of a
// fenced ConfigMap without a token is denied.
func (e *env) registerFencedObjects(ctx context.Context) error {
	c, err := e.client()
	if err != nil {
		return err
	}
	host, err := e.installWebhookConfig(ctx, c, "fenced-objects/webhook.yaml", FencedWebhookConfigName)
	if err != nil {
		return err
	}
	if err := bindConfigMapWriters(ctx, c); err != nil {
		return err
	}
	return e.waitFencedWebhook(ctx, c, host)
}

// waitFencedWebhook returns once the apiserver enforces the fenced-objects
// webhook (served at where): a dry-run create of a fenced ConfigMap without a
// token is denied.
func (e *env) waitFencedWebhook(ctx context.Context, c client.Client, where string) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, e.o.StartTimeout, true, func(ctx context.Context) (bool, error) {
		probe := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
			Namespace: "default", Name: "kubelock-dev-probe",
			Labels:      map[string]string{locksv1alpha1.FencedLabel: "true"},
			Annotations: map[string]string{locksv1alpha1.FencedByAnnotation: DemoLock},
		}}
		if last = c.Create(ctx, probe, client.DryRunAll); last == nil {
			last = errors.New("a fenced ConfigMap without a token was admitted")
		}
		return strings.Contains(last.Error(), "[kubelock:"+string(rules.RuleStaleToken)+"]"), nil
	})
	if err != nil {
		return fmt.Errorf("the apiserver does not call the fenced-objects webhook at %s: %w (operator log: %s)", where, last, e.operatorLog)
	}
	e.progress("fenced-objects webhook registered for ConfigMaps labelled %s=true", locksv1alpha1.FencedLabel)
	return nil
}

// bindConfigMapWriters lets the lock users and the break-glass user write
// ConfigMaps in namespace default, so they can try fenced objects.
func bindConfigMapWriters(ctx context.Context, c client.Client) error {
	const name = "kubelock-dev-configmap-writers"
	role := &rbacv1.Role{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"},
			Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}}},
	}
	rb := &rbacv1.RoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
	}
	for _, u := range append(append([]string(nil), LockUsers...), BreakglassUser) {
		rb.Subjects = append(rb.Subjects, rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: u})
	}
	for _, obj := range []runtime.Object{role, rb} {
		u, err := toUnstructured(obj)
		if err != nil {
			return err
		}
		if err := apply(ctx, c, u); err != nil {
			return fmt.Errorf("creating %s %s: %w", u.GetKind(), name, err)
		}
	}
	return nil
}

// readObjects reads the embedded manifests matching the patterns.
func readObjects(patterns ...string) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	for _, pat := range patterns {
		files, err := fs.Glob(kubelockconfig.FS, pat)
		if err != nil {
			return nil, err
		}
		if len(files) == 0 {
			return nil, fmt.Errorf("no embedded manifest %s", pat)
		}
		for _, f := range files {
			data, err := kubelockconfig.FS.ReadFile(f)
			if err != nil {
				return nil, err
			}
			objs, err := decodeObjects(data)
			if err != nil {
				return nil, fmt.Errorf("reading %s: %w", path.Join("config", f), err)
			}
			out = append(out, objs...)
		}
	}
	return out, nil
}

// decodeObjects reads a multi-document YAML (or JSON) stream of objects.
func decodeObjects(data []byte) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var m map[string]any
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return nil, err
		}
		if len(m) > 0 {
			out = append(out, &unstructured.Unstructured{Object: m})
		}
	}
}

// recordLastApplied sets the annotation in which `kubectl apply` (client-side)
// keeps the configuration it applied: obj's JSON without that annotation, its
// other annotations an empty map when there are none, as kubectl encodes it.
func recordLastApplied(obj *unstructured.Unstructured) error {
	annotations := obj.GetAnnotations()
	if annotations == nil {
		annotations = map[string]string{}
	}
	delete(annotations, corev1.LastAppliedConfigAnnotation)
	obj.SetAnnotations(annotations)
	config, err := runtime.Encode(unstructured.UnstructuredJSONScheme, obj)
	if err != nil {
		return fmt.Errorf("encoding %s %s: %w", obj.GetKind(), obj.GetName(), err)
	}
	annotations[corev1.LastAppliedConfigAnnotation] = string(config)
	obj.SetAnnotations(annotations)
	return nil
}

// apply creates or updates obj by server-side apply, as kubelock-dev.
func apply(ctx context.Context, c client.Client, obj *unstructured.Unstructured) error {
	return c.Apply(ctx, client.ApplyConfigurationFromUnstructured(obj), client.FieldOwner("kubelock-dev"), client.ForceOwnership)
}

func waitEstablished(ctx context.Context, c client.Client, name string, timeout time.Duration) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if last = c.Get(ctx, client.ObjectKey{Name: name}, crd); last == nil {
			last = errors.New("not established yet")
			for _, cond := range crd.Status.Conditions {
				if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
					last = nil
				}
			}
		}
		return last == nil, nil
	})
	if err != nil {
		return fmt.Errorf("CRD %s: %w", name, errors.Join(err, last))
	}
	return nil
}

func toUnstructured(obj runtime.Object) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: m}
	unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
	unstructured.RemoveNestedField(u.Object, "status")
	return u, nil
}
