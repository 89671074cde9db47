package admission

import (
	"context"
	"fmt"
	"strings"

	"github.com/google/go-cmp/cmp"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/rules"
)

// The red team's holes in the first hardened rules: each one a hostile write that both
// engines deny with its rule's message, leaving the lock byte for byte as it was.

const msgManagedFields = "a lock user's write may not leave more than 2 server-side apply entries in metadata.managedFields when it adds one: each apply under another fieldManager adds one, as large as the status it owns, and they could grow the lock until no acquisition fits in etcd any more"

// labels sets n labels of 127 bytes each.
func labels(n int) func(*metav1.ObjectMeta) {
	return func(m *metav1.ObjectMeta) {
		m.Labels = map[string]string{}
		for i := range n {
			m.Labels[fmt.Sprintf("k%06d-%s", i, strings.Repeat("k", 50))] = strings.Repeat("v", 63)
		}
	}
}

// noopApply server-side applies the lock's current fencingToken (a write that
// changes nothing of status) as u under field manager manager: the apiserver
// still records a managedFields entry for manager, as large as the fields it
// applies.
func noopApply(ctx context.Context, u *user, key client.ObjectKey, manager string) error {
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": locksv1alpha1.GroupVersion.String(), "kind": "DistributedLock",
		"metadata": map[string]any{"namespace": key.Namespace, "name": key.Name},
		"status":   map[string]any{"fencingToken": get(ctx, key).Status.FencingToken},
	}}
	return u.c.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(obj), client.FieldOwner(manager), client.ForceOwnership)
}

// applyEntries counts the lock's managedFields entries of server-side applies.
func applyEntries(l *locksv1alpha1.DistributedLock) int {
	n := 0
	for _, m := range l.ManagedFields {
		if m.Operation == metav1.ManagedFieldsOperationApply {
			n++
		}
	}
	return n
}

// managersUpTo adds no-op applies by u until the lock has n apply entries.
func managersUpTo(ctx context.Context, u *user, key client.ObjectKey, n int) {
	for i := 0; applyEntries(get(ctx, key)) < n; i++ {
		Expect(i).To(BeNumerically("<", n), "each apply adds an entry")
		Expect(noopApply(ctx, u, key, fmt.Sprintf("%s-setup-%d", u.name, i))).To(Succeed())
	}
}

var _ = Describe("red team", Ordered, ContinueOnFailure, func() {
	for _, e := range crdEngines {
		redteamSpecs(e)
	}
})

// redteamSpecs are the red team's bulk-metadata cases, with engine e.
func redteamSpecs(e engine) {
	Context("with the "+string(e)+" engine", func() {
		var ns string
		BeforeAll(func(ctx SpecContext) {
			activate(ctx, e)
			ns = namespace(ctx, "red-"+string(e))
		})

		DescribeTable("denies a lock user's create with bulk metadata and stores nothing",
			func(ctx SpecContext, meta func(*metav1.ObjectMeta), sets string) {
				key := client.ObjectKey{Namespace: ns, Name: "bulk-" + randomSuffix()}
				err := createAs(locksv1alpha1.DistributedLockSpec{}, meta)(ctx, alice, key)
				Expect(err).To(HaveOccurred(), "the create was admitted")
				Expect(isDenial(err)).To(BeTrue(), "not a denial: %v", err)
				for _, w := range createDenied("alice", sets) {
					Expect(err.Error()).To(ContainSubstring(w))
				}
				Expect(err.Error()).To(ContainSubstring(denialPrefix(e)))
				Expect(apierrors.IsNotFound(env.Client.Get(ctx, key, &locksv1alpha1.DistributedLock{}))).To(BeTrue(), "a denied create stored a lock")
			},
			// 12,380 labels of 127 bytes: the lock is created just below etcd's
			// request limit (1.5 MiB), and no later write fits: not the first
			// acquisition, not the controller's expiry.
			Entry("a lock just below etcd's request limit (12,380 labels)", labels(12380), "metadata.labels (12380, at most 16)"),
			Entry("17 labels", labels(17), "metadata.labels (17, at most 16)"),
			Entry("17 annotations", func(m *metav1.ObjectMeta) {
				m.Annotations = map[string]string{}
				for i := range 17 {
					m.Annotations[fmt.Sprint("example.com/a", i)] = strings.Repeat("v", 10000)
				}
			}, "metadata.annotations (17, at most 16)"),
			Entry("an ownerReference (Kubernetes' garbage collector would delete the lock once free)", func(m *metav1.ObjectMeta) {
				m.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "mine", UID: "0c0ffee0-0000-0000-0000-000000000000"}}
			}, "metadata.ownerReferences"),
			bulkAnnotationEntries(),
		)

		It("denies a server-side apply entry in managedFields beyond the bound by a lock user (no-op applies under ever new field managers)", func(ctx SpecContext) {
			key := heldQueue.build(ctx, ns)
			managersUpTo(ctx, bob, key, rules.MaxManagedFields)
			before, beforeRaw := get(ctx, key), getRaw(ctx, key)
			Expect(applyEntries(before)).To(Equal(rules.MaxManagedFields))

			err := noopApply(ctx, bob, key, "bob-"+strings.Repeat("x", 120))
			Expect(err).To(HaveOccurred(), "the write was admitted")
			Expect(isDenial(err)).To(BeTrue(), "not a denial: %v", err)
			Expect(err.Error()).To(ContainSubstring(tag(rules.RuleBookkeeping) + msgManagedFields))
			Expect(err.Error()).To(ContainSubstring(denialPrefix(e)))
			after, afterRaw := get(ctx, key), getRaw(ctx, key)
			Expect(after.ResourceVersion).To(Equal(before.ResourceVersion))
			Expect(cmp.Diff(before, after)).To(BeEmpty())
			Expect(string(afterRaw)).To(Equal(string(beforeRaw)))

			// The rightful writers still write: a renewal, a leave, a release
			// (each an update under its client's field manager), also from a
			// program that never wrote the lock (a new field manager).
			l := get(ctx, key)
			renew(l)
			Expect(alice.c.Status().Update(ctx, l, client.FieldOwner("alice-new-program"))).To(Succeed())
			Expect(get(ctx, key).ManagedFields).To(ContainElement(HaveField("Manager", "alice-new-program")))
			Expect(write(ctx, carol, key, func(l *locksv1alpha1.DistributedLock) { l.Status.RemoveWaiter(requestID("carol", 1)) })).To(Succeed())
			Expect(write(ctx, alice, key, end(locksv1alpha1.EndReasonReleased, "alice"))).To(Succeed())
		})
	})
}
