package integration

import (
	"context"
	"strconv"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/webhook"
)

var _ = Describe("Kubernetes objects fenced by a lock", Ordered, func() {
	BeforeAll(func(ctx SpecContext) {
		Expect(env.FencedObjectsWebhook(ctx)).To(Succeed())
	})

	It("accepts equal and higher tokens and refuses stale, missing and unissued ones", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		newLock(ctx, ns, "config-writer", locksv1alpha1.DistributedLockSpec{})
		c, _ := newClient(ctx, ns)
		first, err := c.Acquire(ctx, "config-writer")
		Expect(err).NotTo(HaveOccurred())
		Expect(first.Release(ctx)).To(Succeed())
		second, err := c.Acquire(ctx, "config-writer")
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = second.Release(context.Background()) })

		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: "settings",
			Labels:      map[string]string{"locks.kubelock.io/fenced": "true"},
			Annotations: map[string]string{webhook.FencedByAnnotation: "config-writer"},
		}, Data: map[string]string{"mode": "initial"}}
		Expect(env.Client.Create(ctx, cm)).To(Succeed())

		write := func(token *int64, mode string) error {
			cur := &corev1.ConfigMap{}
			Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(cm), cur)).To(Succeed())
			delete(cur.Annotations, webhook.FencingTokenAnnotation)
			if token != nil {
				cur.Annotations[webhook.FencingTokenAnnotation] = strconv.FormatInt(*token, 10)
			}
			cur.Data["mode"] = mode
			return env.Client.Update(ctx, cur)
		}
		stored := func() string {
			cur := &corev1.ConfigMap{}
			Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(cm), cur)).To(Succeed())
			return cur.Data["mode"]
		}
		t1, t2 := first.FencingToken(), second.FencingToken()
		Expect(write(&t2, "by the current holder")).To(Succeed())
		Expect(write(&t2, "again, equal token")).To(Succeed())

		err = write(&t1, "by the former holder")
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "got %v", err)
		Expect(err.Error()).To(ContainSubstring("stale fencing token %d for lock \"config-writer\": this object already accepted token %d", t1, t2))
		Expect(stored()).To(Equal("again, equal token"))

		err = write(nil, "without a token")
		Expect(err).To(MatchError(ContainSubstring("must carry the " + webhook.FencingTokenAnnotation)))

		forged := t2 + 1000
		err = write(&forged, "with a forged token")
		Expect(err).To(MatchError(ContainSubstring("was never issued")))
		Expect(stored()).To(Equal("again, equal token"))
	})
})
