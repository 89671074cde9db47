package v1alpha1_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	locksv1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// TestSchemaMatchesConstants holds the generated CRD's bounds to the
// constants the client, admission and the controller use: the markers cannot
// name them.
func TestSchemaMatchesConstants(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "config", "crd", "bases", "locks.kubelock.io_distributedlocks.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(b, crd); err != nil {
		t.Fatal(err)
	}
	root := crd.Spec.Versions[0].Schema.OpenAPIV3Schema
	prop := func(path string) apiextensionsv1.JSONSchemaProps {
		p := *root
		for _, name := range strings.Split(path, ".") {
			if p.Items != nil {
				p = *p.Items.Schema
			}
			p = p.Properties[name]
		}
		return p
	}
	maximum := func(path string, want int) {
		if p := prop(path); p.Maximum == nil || int(*p.Maximum) != want {
			t.Errorf("%s: maximum %v, want %d", path, p.Maximum, want)
		}
	}
	maxItems := func(path string, want int) {
		if p := prop(path); p.MaxItems == nil || int(*p.MaxItems) != want {
			t.Errorf("%s: maxItems %v, want %d", path, p.MaxItems, want)
		}
	}
	rule := func(path, want string) {
		for _, r := range prop(path).XValidations {
			if strings.Contains(r.Rule, want) {
				return
			}
		}
		t.Errorf("%s: no rule says %q", path, want)
	}
	maximum("spec.permits", locksv1.MaxSharedHolders)
	maximum("spec.maxWaiters", locksv1.MaxWaitersLimit)
	maximum("spec.maxWaitersPerUser", locksv1.MaxWaitersLimit)
	maximum("spec.leaseDurationSeconds", locksv1.MaxLeaseDurationSeconds)
	maximum("spec.maxLeaseDurationSeconds", locksv1.MaxLeaseDurationSeconds)
	maximum("spec.maxWaitSeconds", locksv1.MaxWaitSecondsLimit)
	maxItems("status.sharedHolders", locksv1.StoredListLimit)
	rule("status.sharedHolders", fmt.Sprintf("size(self) <= %d ||", locksv1.MaxSharedHolders))
	maximum("status.sharedHolders.slot", locksv1.StoredListLimit-1)
	maximum("status.recentAcquisitions.slot", locksv1.StoredListLimit-1)
	maximum("status.holderCount", locksv1.StoredListLimit)
	maxItems("status.waiters", locksv1.StoredListLimit)
	rule("status.waiters", fmt.Sprintf("size(self) <= %d ||", locksv1.MaxWaitersLimit))
	maximum("status.waiterCount", locksv1.StoredListLimit)
	maxItems("status.recentAcquisitions", locksv1.MaxRecentAcquisitions)
	maxItems("status.conditions", locksv1.MaxConditions)
	rule("status.conditions", fmt.Sprintf("size(c.message) <= %d", locksv1.MaxConditionMessage))
	if d := prop("spec.maxWaiters").Default; d == nil || string(d.Raw) != fmt.Sprint(locksv1.DefaultMaxWaiters) {
		t.Errorf("spec.maxWaiters: default %v, want %d", d, locksv1.DefaultMaxWaiters)
	}
}

// Earlier releases allowed 1,024 shared holders and waiters. A lock they
// stored with more than this release's caps stays writable: every write
// that does not grow a list past its cap is taken, so its holdings renew,
// release and expire and its waiters leave.
var _ = Describe("a lock stored above the caps by an earlier release", func() {
	const extra = 6
	var key types.NamespacedName

	BeforeEach(func(ctx SpecContext) {
		l := newLock()
		rwMutex(l)
		Expect(env.Client.Create(ctx, l)).To(Succeed())
		key = client.ObjectKeyFromObject(l)
		// Up to the caps through the apiserver, beyond them as an earlier
		// release's schema let them be stored.
		readers(locksv1.MaxSharedHolders)(l)
		Expect(env.Client.Status().Update(ctx, l)).To(Succeed())
		Expect(env.Client.Get(ctx, key, l)).To(Succeed())
		l.Spec.MaxWaiters = ptr.To[int32](locksv1.StoredListLimit)
		for i := range extra {
			h := l.Status.SharedHolders[0]
			h.Slot, h.LeaseID = int32(locksv1.MaxSharedHolders+i), fmt.Sprintf("lease-extra-%08d", i)
			l.Status.SharedHolders = append(l.Status.SharedHolders, h)
		}
		for i := range locksv1.MaxWaitersLimit + extra {
			l.Status.AppendWaiter(waiter("carol", 1000+i))
		}
		l.SyncCounts()
		Expect(env.RewriteStored(ctx, locksv1.GroupVersion.WithResource("distributedlocks").GroupResource(), key, func(obj map[string]any) {
			obj["spec"], obj["status"] = asJSON(l.Spec), asJSON(l.Status)
		})).To(Succeed())
	})

	get := func(ctx context.Context) *locksv1.DistributedLock {
		l := &locksv1.DistributedLock{}
		Expect(env.Client.Get(ctx, key, l)).To(Succeed())
		return l
	}

	It("renews, releases and lets waiters leave, and refuses a write that grows a list", func(ctx SpecContext) {
		l := get(ctx)
		Expect(l.Status.SharedHolders).To(HaveLen(locksv1.MaxSharedHolders + extra))
		Expect(l.Status.Waiters).To(HaveLen(locksv1.MaxWaitersLimit + extra))

		By("a renewal of a reader above the cap")
		now := micro()
		l.Status.SharedHolders[locksv1.MaxSharedHolders].RenewTime = &now
		Expect(env.Client.Status().Update(ctx, l)).To(Succeed())

		By("a release and a waiter leaving")
		Expect(l.EndShared(l.Status.SharedHolders[locksv1.MaxSharedHolders].LeaseID, locksv1.EndReasonReleased, "carol", micro())).To(BeTrue())
		Expect(l.Status.RemoveWaiter(l.Status.Waiters[0].RequestID)).To(BeTrue())
		Expect(env.Client.Status().Update(ctx, l)).To(Succeed())

		By("a new reader and a new waiter, each refused while its list is above the cap")
		grown := l.DeepCopy()
		readers(1)(grown)
		grown.Status.SharedHolders[len(grown.Status.SharedHolders)-1].Slot = locksv1.StoredListLimit - 1
		err := env.Client.Status().Update(ctx, grown)
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "got %v", err)
		Expect(err.Error()).To(ContainSubstring("status.sharedHolders must not grow beyond 64 entries"))
		grown = l.DeepCopy()
		grown.Status.AppendWaiter(waiter("dave", 1))
		err = env.Client.Status().Update(ctx, grown)
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "got %v", err)
		Expect(err.Error()).To(ContainSubstring("status.waiters must not grow beyond 128 entries"))
		Expect(get(ctx).ResourceVersion).To(Equal(l.ResourceVersion), "a refused write changed the lock")

		By("an administrator's spec edit that keeps the stored maxWaiters (ratcheting)")
		l = get(ctx)
		l.Spec.HandoffTimeoutSeconds = 20
		Expect(env.Client.Update(ctx, l)).To(Succeed())
		Expect(*get(ctx).Spec.MaxWaiters).To(Equal(int32(locksv1.StoredListLimit)))
		Expect(get(ctx).MaxWaiters()).To(Equal(locksv1.MaxWaitersLimit), "the lock admits no more than the cap")
	})
})

// asJSON is v as encoding/json writes it, decoded into maps.
func asJSON(v any) any {
	b, err := json.Marshal(v)
	Expect(err).NotTo(HaveOccurred())
	var out any
	Expect(json.Unmarshal(b, &out)).To(Succeed())
	return out
}
