package main

import (
	"context"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// --- raw CRD CAS -----------------------------------------------------------------

// The bare CRD is the floor of any lock kept in a custom resource: a kind with a
// Lease's fields and nothing else (no status subresource, no CEL, no admission,
// no controller), written by get-then-update CAS as JSON, as raw Lease CAS
// writes Leases. What kubelock costs beyond it is kubelock's own; what it costs
// beyond a Lease is the price of being a custom resource.
var bareGVR = schema.GroupVersionResource{Group: "bench.kubelock.io", Version: "v1", Resource: "barelocks"}

// bareCRD is the bare CRD: a structural schema of a Lease's spec.
func bareCRD() *apiextensionsv1.CustomResourceDefinition {
	str := apiextensionsv1.JSONSchemaProps{Type: "string"}
	time := apiextensionsv1.JSONSchemaProps{Type: "string", Format: "date-time"}
	i32 := apiextensionsv1.JSONSchemaProps{Type: "integer", Format: "int32"}
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: bareGVR.Resource + "." + bareGVR.Group},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: bareGVR.Group,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: bareGVR.Resource, Singular: "barelock", Kind: "BareLock", ListKind: "BareLockList"},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: bareGVR.Version, Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object",
					Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"apiVersion": str, "kind": str, "metadata": {Type: "object"},
						"spec": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
							"holderIdentity": str, "leaseDurationSeconds": i32, "acquireTime": time, "renewTime": time, "leaseTransitions": i32,
						}},
					},
				}},
			}},
		},
	}
}

// installBareCRD creates the bare CRD and waits until it is served.
func installBareCRD(c *cluster) error {
	_, err := envtest.InstallCRDs(c.admin, envtest.CRDInstallOptions{CRDs: []*apiextensionsv1.CustomResourceDefinition{bareCRD()}})
	return err
}

// createBareLocks creates n bare locks in leaseNS, named as the Leases are.
func createBareLocks(ctx context.Context, dc dynamic.Interface, n int) (time.Duration, error) {
	ri := dc.Resource(bareGVR).Namespace(leaseNS)
	return createObjects(ctx, n, 48, func(ctx context.Context, i int) error {
		obj := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": bareGVR.GroupVersion().String(), "kind": "BareLock",
			"metadata": map[string]any{"name": lockName(i)},
			"spec":     map[string]any{},
		}}
		_, err := ri.Create(ctx, obj, metav1.CreateOptions{})
		return ignoreExists(err)
	})
}

// bareLocker takes bare locks exactly as leaseLocker takes Leases: a GET, then
// an update of the object it read; renew and release update the object of the
// previous response.
type bareLocker struct {
	ri       []dynamic.ResourceInterface
	identity string
}

func newBareLocker(cfg *rest.Config, ns string, n int) (*bareLocker, error) {
	b := &bareLocker{identity: "bench"}
	for range n {
		dc, err := dynamic.NewForConfig(cfg)
		if err != nil {
			return nil, err
		}
		b.ri = append(b.ri, dc.Resource(bareGVR).Namespace(ns))
	}
	return b, nil
}

func (b *bareLocker) acquire(ctx context.Context, key string) (holding, error) {
	ri := b.ri[clientFor(key, len(b.ri))]
	obj, err := ri.Get(ctx, key, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	if h, _, _ := unstructured.NestedString(obj.Object, "spec", "holderIdentity"); h != "" {
		return nil, errLeaseHeld
	}
	t, _, _ := unstructured.NestedInt64(obj.Object, "spec", "leaseTransitions")
	now := microNow()
	if err := unstructured.SetNestedMap(obj.Object, map[string]any{
		"holderIdentity": b.identity, "leaseDurationSeconds": int64(30),
		"acquireTime": now, "renewTime": now, "leaseTransitions": t + 1,
	}, "spec"); err != nil {
		return nil, err
	}
	next, err := ri.Update(ctx, obj, metav1.UpdateOptions{})
	if err != nil {
		return nil, err
	}
	return &bareHolding{ri: ri, obj: next}, nil
}

type bareHolding struct {
	ri  dynamic.ResourceInterface
	obj *unstructured.Unstructured
}

func (h *bareHolding) renew(ctx context.Context) error {
	o := h.obj.DeepCopy()
	if err := unstructured.SetNestedField(o.Object, microNow(), "spec", "renewTime"); err != nil {
		return err
	}
	return h.update(ctx, o)
}

func (h *bareHolding) release(ctx context.Context) error {
	o := h.obj.DeepCopy()
	for _, f := range []string{"holderIdentity", "acquireTime", "renewTime"} {
		unstructured.RemoveNestedField(o.Object, "spec", f)
	}
	return h.update(ctx, o)
}

func (h *bareHolding) update(ctx context.Context, o *unstructured.Unstructured) error {
	next, err := h.ri.Update(ctx, o, metav1.UpdateOptions{})
	if err != nil {
		return err
	}
	h.obj = next
	return nil
}

// microNow is now as a Lease's MicroTime serialises.
func microNow() string { return time.Now().UTC().Format(metav1.RFC3339Micro) }

func bareHold(b *bareLocker) holdTarget {
	return holdTarget{resources: []string{bareGVR.Resource},
		acquire: func(ctx context.Context, _ int, key string) (holding, error) { return b.acquire(ctx, key) }}
}
