package admission

import (
	"context"
	"fmt"
	"strings"

	"github.com/google/go-cmp/cmp"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	kwebhook "github.com/kubelock/kubelock/webhook"
)

// The red team's holes (after issue 13): each one a hostile write that both
// engines deny with its rule's message, leaving the lock byte for byte as it was.

const msgManagedFields = "a lock user's write may not add a metadata.managedFields entry beyond 16: every field manager (such as each server-side apply with another fieldManager) adds one, and they could grow the lock until the next release or expiry no longer fits in etcd"

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

// managersUpTo adds no-op applies by u until the lock has n managedFields entries.
func managersUpTo(ctx context.Context, u *user, key client.ObjectKey, n int) {
	for i := 0; len(get(ctx, key).ManagedFields) < n; i++ {
		Expect(i).To(BeNumerically("<", n), "each apply adds an entry")
		Expect(noopApply(ctx, u, key, fmt.Sprintf("%s-setup-%d", u.name, i))).To(Succeed())
	}
}

var _ = Describe("red team", Ordered, ContinueOnFailure, func() {
	for _, e := range []engine{engineWebhook, enginePolicy} {
		Context("with the "+string(e)+" engine", func() {
			var ns string
			BeforeAll(func(ctx SpecContext) {
				activate(ctx, e)
				ns = namespace(ctx, "red-"+string(e))
			})

			It("denies a 17th managedFields entry by a lock user (no-op applies under ever new field managers)", func(ctx SpecContext) {
				key := heldQueue.build(ctx, ns)
				managersUpTo(ctx, bob, key, kwebhook.MaxManagedFields)
				before, beforeRaw := get(ctx, key), getRaw(ctx, key)
				Expect(before.ManagedFields).To(HaveLen(kwebhook.MaxManagedFields))

				err := noopApply(ctx, bob, key, "bob-"+strings.Repeat("x", 120))
				Expect(err).To(HaveOccurred(), "the write was admitted")
				Expect(isDenial(err)).To(BeTrue(), "not a denial: %v", err)
				Expect(err.Error()).To(ContainSubstring(tag(kwebhook.RuleBookkeeping) + msgManagedFields))
				Expect(err.Error()).To(ContainSubstring(denialPrefix(e)))
				after, afterRaw := get(ctx, key), getRaw(ctx, key)
				Expect(after.ResourceVersion).To(Equal(before.ResourceVersion))
				Expect(cmp.Diff(before, after)).To(BeEmpty())
				Expect(string(afterRaw)).To(Equal(string(beforeRaw)))

				// The rightful writers still write: a renewal, a leave, a release
				// (each an update under its client's one field manager).
				Expect(write(ctx, alice, key, renew)).To(Succeed())
				Expect(write(ctx, carol, key, func(l *locksv1alpha1.DistributedLock) { l.Status.RemoveWaiter(requestID("carol", 1)) })).To(Succeed())
				Expect(write(ctx, alice, key, end(locksv1alpha1.EndReasonReleased, "alice"))).To(Succeed())
			})
		})
	}
})
