package sizebudget

import (
	"context"
	"maps"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/rules"
	"github.com/kubelock/kubelock/test/testenv"
)

// TestLargestSessionFitsEtcd builds the largest LockSession the schema
// admits, as its owner and the controller would write it: spec's strings at
// their longest, of the costliest characters their patterns admit; metadata
// as large as a lock user may create it, with the ownerReference of a
// pod-bound session; as many Update managers as the apiserver keeps, each
// owning a part of it, and server-side applies of the metadata and spec,
// each under a manager of its own. A session has no list of its
// own, so its size is metadata's: the test measures what the lock's test
// does not, that nothing else in it grows.
func TestLargestSessionFitsEtcd(t *testing.T) {
	ctx := context.Background()
	w := worstOf(t, filepath.Join(testenv.RepoRoot(), "config", "crd", "bases", "locks.kubelock.io_locksessions.yaml"))

	s := w.session()
	key := types.NamespacedName{Namespace: s.Namespace, Name: s.Name}
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: s.Namespace}}); err != nil {
		t.Fatal(err)
	}
	u := toUnstructured(t, s, "LockSession")
	delete(u.Object, "status")
	if err := env.Client.Create(ctx, u, client.FieldOwner(w.manager(0))); err != nil {
		t.Fatalf("creating the session: %v", err)
	}
	// As many Update managers as the apiserver keeps, each owning a part: the
	// creator, one that renews (renewTime and locks, the whole status), and
	// the rest each changing one label, as the session's owner may.
	u.Object["status"] = map[string]any{"renewTime": w.microTime(1), "locks": int64(math.MaxInt32)}
	if err := env.Client.Status().Update(ctx, u, client.FieldOwner(w.manager(1))); err != nil {
		t.Fatalf("renewal: %v", err)
	}
	labels := u.GetLabels()
	keys := slices.Sorted(maps.Keys(labels))
	for m := 2; m < updateManagers; m++ {
		labels[keys[m]] = unique(labels[keys[m]], m)
		u.SetLabels(labels)
		if err := env.Client.Update(ctx, u, client.FieldOwner(w.manager(m))); err != nil {
			t.Fatalf("label change by manager %d: %v", m, err)
		}
	}
	// A lock user's server-side applies of metadata and spec, each under a
	// manager of its own: each owns every label, annotation and the
	// ownerReference, the largest keys a session has.
	meta := as[map[string]any](t, u.Object["metadata"])
	for m := range rules.MaxManagedFields {
		apply := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": locksv1alpha1.GroupVersion.String(), "kind": "LockSession",
			"metadata": map[string]any{
				"name": key.Name, "namespace": key.Namespace,
				"labels": meta["labels"], "annotations": meta["annotations"], "ownerReferences": meta["ownerReferences"],
			},
			"spec": u.Object["spec"],
		}}
		if err := env.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(apply), client.FieldOwner(w.manager(updateManagers+m))); err != nil {
			t.Fatalf("apply %d: %v", m, err)
		}
	}

	stored := measure(t, locksv1alpha1.GroupVersion.WithResource(locksv1alpha1.LockSessionsResource).GroupResource(), key)
	w.checkSession(t, stored.object)
}

// session is the largest session, in a namespace of its own.
func (w worst) session() *locksv1alpha1.LockSession {
	meta := largestCreatedMeta()
	meta.Namespace = strings.Repeat("s", 63)
	s := &locksv1alpha1.LockSession{
		ObjectMeta: meta,
		Spec: locksv1alpha1.LockSessionSpec{
			User: w.str("spec.user"), Identity: w.str("spec.identity"), TTLSeconds: locksv1alpha1.MaxSessionTTLSeconds,
			PodName: w.str("spec.podName"), PodUID: "0b7e4b6c-6f3a-4d5e-9c1a-2f0e8d7c6b5a",
		},
	}
	s.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: s.Spec.PodName, UID: types.UID(s.Spec.PodUID)}}
	return s
}

// checkSession fails t unless obj, the session as stored, has the strings,
// the metadata and the managers asked for (see checkBuilt).
func (w worst) checkSession(t *testing.T, obj map[string]any) {
	t.Helper()
	spec := as[map[string]any](t, obj["spec"])
	for f, want := range map[string]string{"user": w.str("spec.user"), "identity": w.str("spec.identity"), "podName": w.str("spec.podName")} {
		if spec[f] != want {
			t.Errorf("spec.%s was stored as %.40q…, want %.40q…", f, spec[f], want)
		}
	}
	meta := as[map[string]any](t, obj["metadata"])
	for _, f := range []string{"labels", "annotations"} {
		if n := len(as[map[string]any](t, meta[f])); n != 16 {
			t.Errorf("metadata.%s has %d entries as stored, want 16", f, n)
		}
	}
	if renewed := as[map[string]any](t, obj["status"])["renewTime"]; renewed != w.microTime(1) {
		t.Errorf("status.renewTime was stored as %v, want %s", renewed, w.microTime(1))
	}
	managers := as[[]any](t, meta["managedFields"])
	if want := updateManagers + rules.MaxManagedFields; len(managers) != want {
		t.Errorf("managedFields has %d entries as stored, want %d (every Update manager and each apply)", len(managers), want)
	}
	t.Logf("managedFields has %d entries as stored", len(managers))
}
