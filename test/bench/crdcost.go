package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/testenv"
)

// costCluster is the control plane of the CRD's variants, a Lease's and the
// bare CRD's: its processes, an administrator's clients (no client-side
// rate limit), and a busy lock whose status the other variants copy.
type costCluster struct {
	path  path // kube-apiserver and its etcd
	admin *rest.Config
	cl    client.Client
	cs    kubernetes.Interface
	dyn   dynamic.Interface
	lc    *lock.Client
	// held is the busy lock as pkg/lock leaves it: 8 finished holdings and one held.
	held *unstructured.Unstructured
	// op runs the operator that serves the webhook, its files in op.dir.
	op *cluster
}

// newCostCluster makes the clients on env, the namespace and the busy lock.
// Stop it with stop, also after an error.
func newCostCluster(ctx context.Context, env *testenv.Env) (*costCluster, error) {
	dir, err := os.MkdirTemp("", "kubelock-write-cost-operator-")
	if err != nil {
		return nil, err
	}
	cc := &costCluster{path: clusterPath(env), admin: rest.CopyConfig(env.Config)}
	cc.admin.QPS = -1
	cc.op = &cluster{dir: dir, env: env, admin: cc.admin, logf: logf}
	if cc.cl, err = client.New(cc.admin, client.Options{Scheme: env.Scheme}); err != nil {
		return cc, err
	}
	if cc.cs, err = kubernetes.NewForConfig(cc.admin); err != nil {
		return cc, err
	}
	cc.op.adminCS = cc.cs
	if cc.dyn, err = dynamic.NewForConfig(cc.admin); err != nil {
		return cc, err
	}
	if err := cc.cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: costNS}}); err != nil {
		return cc, err
	}
	if cc.lc, err = lock.New(cc.admin, lock.WithNamespace(costNS), lock.WithIdentity("writer-0"), lock.WithoutAutoRenew(), lock.WithAutoCreate()); err != nil {
		return cc, err
	}
	cc.held, err = fillLock(ctx, cc.lc, cc.dyn, "cost", fullRounds)
	return cc, err
}

// stop stops the operator and removes its files.
func (cc *costCluster) stop() {
	if cc.op.mgr != nil {
		_ = cc.op.mgr.Stop(10 * time.Second)
	}
	_ = os.RemoveAll(cc.op.dir)
}

// clusterPath is env's kube-apiserver and etcd.
func clusterPath(env *testenv.Env) path {
	var p path
	p[roleKube] = proc{name: "kube-apiserver", pid: env.Cluster.APIServer().Running().Pid()}
	p[roleEtcd] = proc{name: "etcd", pid: env.Cluster.Etcd.Members[0].Running().Pid()}
	return p
}

// statusWrite is a variant of the lock's status renewal on the cluster: a
// PUT of the whole object (without its managedFields when strip, with
// options opts), or a merge patch (patch), of lock in the resource gvr;
// the operator is on its path when it serves the lock's webhook.
type statusWrite struct {
	name                   string
	gvr                    schema.GroupVersionResource
	lock                   string
	strip, patch, operator bool
	opts                   metav1.UpdateOptions
}

// bindAdmission binds the webhook to lock cost-webhook and the policy to
// cost-policy, which it creates.
func (cc *costCluster) bindAdmission(ctx context.Context) error {
	if err := cc.bindWebhook(ctx); err != nil {
		return err
	}
	if err := cc.bindPolicy(ctx); err != nil {
		return err
	}
	for _, e := range []engine{engineWebhook, enginePolicy} {
		l := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: costNS, Name: "cost-" + string(e), Labels: labelledFor(e).MatchLabels}}
		if err := cc.cl.Create(ctx, l); err != nil {
			return err
		}
	}
	return nil
}

// variants installs what the cluster's variants need and returns them: the
// CRD's status writes, as shipped, with kubelock's policy, in other forms
// and in copies of the CRD; the bare CRD's; a Lease's.
func (cc *costCluster) variants(ctx context.Context) ([]costVariant, error) {
	noCEL, open, err := installCRDCopies(cc.admin)
	if err != nil {
		return nil, err
	}
	if err := cc.bindAdmission(ctx); err != nil {
		return nil, err
	}
	var variants []costVariant
	for _, w := range []statusWrite{
		{name: crdVariant, gvr: lockGVR, lock: "cost"},
		{name: webhookVariant, gvr: lockGVR, lock: "cost-webhook", operator: true},
		{name: policyVariant, gvr: lockGVR, lock: "cost-policy"},
		{name: "DistributedLock status, managedFields not sent", gvr: lockGVR, lock: "cost-strip", strip: true},
		{name: "DistributedLock status, fieldValidation=Ignore", gvr: lockGVR, lock: "cost-ignore", opts: metav1.UpdateOptions{FieldValidation: metav1.FieldValidationIgnore}},
		{name: "DistributedLock status of a fresh lock (held once, recentAcquisitions empty)", gvr: lockGVR, lock: "fresh"},
		{name: "DistributedLock status, JSON merge patch with resourceVersion", gvr: lockGVR, lock: "cost-patch", patch: true},
		{name: "same status, CRD without CEL rules", gvr: noCEL, lock: "cost"},
		{name: "same status, CRD status unvalidated (preserve-unknown-fields)", gvr: open, lock: "cost"},
	} {
		cur, err := cc.current(ctx, w.gvr, w.lock)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", w.name, err)
		}
		p := cc.path
		if w.operator {
			p[roleOperator] = proc{name: "manager", pid: cc.op.mgr.Pid()}
		}
		variants = append(variants, costVariant{name: w.name, path: p, write: statusRenewal(cc.dyn.Resource(w.gvr).Namespace(costNS), cur, w.strip, w.patch, w.opts)})
	}
	baselines, err := cc.baselineVariants(ctx)
	return append(variants, baselines...), err
}

// current is the object a status write starts from: the busy lock; another
// lock of the CRD, filled as pkg/lock fills it (a lock named fresh... only
// held once); or an object of a copy of the CRD given the busy lock's status.
func (cc *costCluster) current(ctx context.Context, gvr schema.GroupVersionResource, name string) (*unstructured.Unstructured, error) {
	switch {
	case gvr == lockGVR && name == cc.held.GetName():
		return cc.held, nil
	case gvr == lockGVR:
		rounds := fullRounds
		if strings.HasPrefix(name, "fresh") {
			rounds = 0
		}
		return fillLock(ctx, cc.lc, cc.dyn, name, rounds)
	}
	ri := cc.dyn.Resource(gvr).Namespace(costNS)
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(gvr.GroupVersion().String())
	u.SetKind("DistributedLock")
	u.SetName(name)
	cur, err := retryCreate(ctx, ri, u)
	if err != nil {
		return nil, err
	}
	status, _, _ := unstructured.NestedMap(cc.held.Object, "status")
	if err := unstructured.SetNestedMap(cur.Object, status, "status"); err != nil {
		return nil, err
	}
	return ri.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
}

// baselineVariants are the bare CRD's renewal and a Lease's.
func (cc *costCluster) baselineVariants(ctx context.Context) ([]costVariant, error) {
	bare, err := bareRenewal(ctx, cc.dyn.Resource(bareGVR).Namespace(costNS))
	if err != nil {
		return nil, err
	}
	lease, err := leaseRenewal(ctx, cc.cs.CoordinationV1().Leases(costNS))
	if err != nil {
		return nil, err
	}
	return []costVariant{
		{name: "bare CRD (a Lease's fields; no status subresource, no CEL), its spec", path: cc.path, write: bare},
		{name: leaseVariant, path: cc.path, write: lease},
	}, nil
}

// installCRDCopies installs the DistributedLock CRD under two other groups,
// without its CEL rules and with a status the apiserver neither validates
// nor prunes, and the bare CRD; it returns the copies' resources.
func installCRDCopies(admin *rest.Config) (noCEL, open schema.GroupVersionResource, err error) {
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := readYAML(filepath.Join(testenv.RepoRoot(), "config", "crd", "bases", "locks.kubelock.io_distributedlocks.yaml"), crd); err != nil {
		return noCEL, open, err
	}
	noCELCRD := regroup(crd, "nocel.kubelock.io")
	stripCEL(noCELCRD.Spec.Versions[0].Schema.OpenAPIV3Schema)
	openCRD := regroup(crd, "open.kubelock.io")
	openCRD.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["status"] = apiextensionsv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: ptrTo(true)}
	openCRD.Spec.Versions[0].Schema.OpenAPIV3Schema.XValidations = nil
	if _, err := envtest.InstallCRDs(admin, envtest.CRDInstallOptions{CRDs: []*apiextensionsv1.CustomResourceDefinition{noCELCRD, openCRD, bareCRD()}}); err != nil {
		return noCEL, open, err
	}
	return lockResource(noCELCRD.Spec.Group), lockResource(openCRD.Spec.Group), nil
}

// lockResource is the DistributedLock resource of a copy of the CRD under group.
func lockResource(group string) schema.GroupVersionResource {
	r := lockGVR
	r.Group = group
	return r
}

// admissionLabel names the admission engine the run binds to a lock:
// "policy" or "webhook". Locks without it are admitted by neither.
const admissionLabel = "bench.kubelock.io/admission"

// labelledFor is a label selector of the locks labelled for engine e.
func labelledFor(e engine) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: map[string]string{admissionLabel: string(e)}}
}

// bindPolicy installs config/policy's status policy, bound to the locks
// labelled for it only, and waits until it denies a write in someone else's
// name: the CRD path with kubelock's rules in kube-apiserver, as the lock
// apiserver runs them in-process.
func (cc *costCluster) bindPolicy(ctx context.Context) error {
	vap, binding, err := readPolicy("validating_admission_policy.yaml", true)
	if err != nil {
		return err
	}
	binding.Spec.MatchResources = &admissionregistrationv1.MatchResources{ObjectSelector: labelledFor(enginePolicy)}
	if err := cc.cl.Create(ctx, vap); err != nil {
		return err
	}
	if err := cc.cl.Create(ctx, binding); err != nil {
		return err
	}
	return awaitDenial(ctx, cc.cl, enginePolicy, "ValidatingAdmissionPolicy")
}

// bindWebhook starts the operator as a replica that does not lead and
// installs its webhook configuration, matched to the locks labelled for it
// only, and waits until the webhook denies a write in someone else's name:
// the CRD path as kubelock ships it, the webhook being its default engine.
func (cc *costCluster) bindWebhook(ctx context.Context) error {
	if err := cc.op.startStandbyManager(ctx); err != nil {
		return err
	}
	w := cc.op.webhookCfg.DeepCopy()
	for i := range w.Webhooks {
		w.Webhooks[i].ObjectSelector = labelledFor(engineWebhook)
	}
	if err := cc.cl.Create(ctx, w); err != nil {
		return err
	}
	return awaitDenial(ctx, cc.cl, engineWebhook, `admission webhook "vdistributedlock`)
}

// awaitDenial polls until a write in someone else's name to a new lock
// labelled for engine e is denied with a message that contains by.
func awaitDenial(ctx context.Context, cl client.Client, e engine, by string) error {
	last := errors.New("none")
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		if last = probeForeignHolder(ctx, cl, e); last == nil {
			last = errors.New("the write was allowed")
			return false, nil
		}
		return strings.Contains(last.Error(), by), nil
	})
	if err != nil {
		return fmt.Errorf("no denial by the %s within a minute (last answer: %w): %w", e, last, err)
	}
	return nil
}

// probeForeignHolder creates a lock labelled for engine e and writes a holder
// in someone else's name into it; nil when both were allowed.
func probeForeignHolder(ctx context.Context, cl client.Client, e engine) error {
	l := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: costNS, GenerateName: string(e) + "-probe-", Labels: labelledFor(e).MatchLabels}}
	if err := cl.Create(ctx, l); err != nil {
		return err
	}
	return writeForeignHolder(ctx, cl, l)
}

var lockGVR = schema.GroupVersionResource{Group: "locks.kubelock.io", Version: "v1alpha1", Resource: "distributedlocks"}

// fillLock leaves key's status as pkg/lock leaves a busy lock: rounds
// acquisitions and releases, then one held; it returns the lock as read.
func fillLock(ctx context.Context, lc *lock.Client, dyn dynamic.Interface, key string, rounds int) (*unstructured.Unstructured, error) {
	for range rounds {
		l, err := lc.TryAcquire(ctx, key)
		if err != nil {
			return nil, err
		}
		if err := l.Release(ctx); err != nil {
			return nil, err
		}
	}
	if _, err := lc.TryAcquire(ctx, key); err != nil {
		return nil, err
	}
	return dyn.Resource(lockGVR).Namespace(lc.Namespace()).Get(ctx, key, metav1.GetOptions{})
}

// renewal writes change(cur) through update, each call on the object the
// previous one returned; the size is that of the JSON the client sends.
func renewal[T any](cur T, change func(T) (T, error), update func(context.Context, T) (T, error)) func(context.Context) (int, error) {
	return func(ctx context.Context) (int, error) {
		next, err := change(cur)
		if err != nil {
			return 0, err
		}
		b, _ := json.Marshal(next)
		if cur, err = update(ctx, next); err != nil {
			return 0, err
		}
		return len(b), nil
	}
}

// statusRenewal renews the holder of cur through ri: a PUT of the whole
// object (without its managedFields when strip), or a merge patch of
// renewTime with the resourceVersion as precondition.
func statusRenewal(ri dynamic.ResourceInterface, cur *unstructured.Unstructured, strip, patch bool, uo metav1.UpdateOptions) func(context.Context) (int, error) {
	if patch {
		return func(ctx context.Context) (int, error) {
			b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": cur.GetResourceVersion()},
				"status": map[string]any{"holder": map[string]any{"renewTime": microNow()}}})
			got, err := ri.Patch(ctx, cur.GetName(), types.MergePatchType, b, metav1.PatchOptions{}, "status")
			if err != nil {
				return 0, err
			}
			cur = got
			return len(b), nil
		}
	}
	return renewal(cur, func(cur *unstructured.Unstructured) (*unstructured.Unstructured, error) {
		next := cur.DeepCopy()
		if strip {
			next.SetManagedFields(nil)
		}
		return next, unstructured.SetNestedField(next.Object, microNow(), "status", "holder", "renewTime")
	}, func(ctx context.Context, next *unstructured.Unstructured) (*unstructured.Unstructured, error) {
		return ri.UpdateStatus(ctx, next, uo)
	})
}

// bareRenewal creates a held bare lock and renews it through ri, as raw CRD
// CAS does: an update of the object the previous write returned.
func bareRenewal(ctx context.Context, ri dynamic.ResourceInterface) (func(context.Context) (int, error), error) {
	now := microNow()
	cur, err := retryCreate(ctx, ri, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": bareGVR.GroupVersion().String(), "kind": "BareLock",
		"metadata": map[string]any{"name": "cost"},
		"spec":     map[string]any{"holderIdentity": "writer-0", "leaseDurationSeconds": int64(30), "acquireTime": now, "renewTime": now, "leaseTransitions": int64(1)},
	}})
	if err != nil {
		return nil, err
	}
	return renewal(cur, func(cur *unstructured.Unstructured) (*unstructured.Unstructured, error) {
		next := cur.DeepCopy()
		return next, unstructured.SetNestedField(next.Object, microNow(), "spec", "renewTime")
	}, func(ctx context.Context, next *unstructured.Unstructured) (*unstructured.Unstructured, error) {
		return ri.Update(ctx, next, metav1.UpdateOptions{})
	}), nil
}

// leaseRenewal creates a held Lease and renews it through leases.
func leaseRenewal(ctx context.Context, leases coordinationv1client.LeaseInterface) (func(context.Context) (int, error), error) {
	id, dur := "writer-0", int32(30)
	now := metav1.NowMicro()
	lease, err := leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "cost"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &id, LeaseDurationSeconds: &dur, AcquireTime: &now, RenewTime: &now}}, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	return renewal(lease, func(cur *coordinationv1.Lease) (*coordinationv1.Lease, error) {
		next := cur.DeepCopy()
		t := metav1.NowMicro()
		next.Spec.RenewTime = &t
		return next, nil
	}, func(ctx context.Context, next *coordinationv1.Lease) (*coordinationv1.Lease, error) {
		return leases.Update(ctx, next, metav1.UpdateOptions{})
	}), nil
}

// regroup is a copy of crd served under group.
func regroup(crd *apiextensionsv1.CustomResourceDefinition, group string) *apiextensionsv1.CustomResourceDefinition {
	c := crd.DeepCopy()
	c.Spec.Group = group
	c.Name = c.Spec.Names.Plural + "." + group
	c.ResourceVersion = ""
	return c
}

// stripCEL removes every x-kubernetes-validations rule from s.
func stripCEL(s *apiextensionsv1.JSONSchemaProps) {
	if s == nil {
		return
	}
	s.XValidations = nil
	for k, p := range s.Properties {
		stripCEL(&p)
		s.Properties[k] = p
	}
	if s.Items != nil {
		stripCEL(s.Items.Schema)
	}
	if s.AdditionalProperties != nil {
		stripCEL(s.AdditionalProperties.Schema)
	}
}

func ptrTo[T any](v T) *T { return &v }

// retryCreate creates u, retrying while the new CRD's endpoint is not served yet.
func retryCreate(ctx context.Context, ri dynamic.ResourceInterface, u *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	var got *unstructured.Unstructured
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var err error
		got, err = ri.Create(ctx, u, metav1.CreateOptions{})
		if err != nil && strings.Contains(err.Error(), "the server could not find the requested resource") {
			return false, nil
		}
		return err == nil, err
	})
	return got, err
}
