package v1alpha1_test

import (
	"fmt"

	"github.com/google/go-cmp/cmp"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/kubelock/kubelock/api/v1alpha1"
)

func newSession() *locksv1.LockSession {
	return &locksv1.LockSession{
		ObjectMeta: metav1.ObjectMeta{Name: "session-" + utilrand.String(8), Namespace: ns},
		Spec:       locksv1.LockSessionSpec{User: "alice", Identity: "worker-1", TTLSeconds: 20},
	}
}

func sessionUnstructured(s *locksv1.LockSession) *unstructured.Unstructured {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(s)
	Expect(err).NotTo(HaveOccurred())
	u := &unstructured.Unstructured{Object: m}
	u.SetGroupVersionKind(locksv1.GroupVersion.WithKind("LockSession"))
	return u
}

var _ = Describe("the LockSession CRD", func() {
	It("is installed namespaced with its short name, status subresource and printer columns", func(ctx SpecContext) {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(apiextensionsv1.SchemeGroupVersion.WithKind("CustomResourceDefinition"))
		Expect(env.Client.Get(ctx, client.ObjectKey{Name: "locksessions.locks.kubelock.io"}, u)).To(Succeed())
		var crd apiextensionsv1.CustomResourceDefinition
		Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &crd)).To(Succeed())
		Expect(crd.Spec.Scope).To(Equal(apiextensionsv1.NamespaceScoped))
		Expect(crd.Spec.Names.Plural).To(Equal(locksv1.LockSessionsResource))
		Expect(crd.Spec.Names.ShortNames).To(Equal([]string{"locksession"}))
		Expect(crd.Spec.Versions).To(HaveLen(1))
		v := crd.Spec.Versions[0]
		Expect(v.Subresources.Status).NotTo(BeNil())
		var columns []string
		for _, c := range v.AdditionalPrinterColumns {
			columns = append(columns, c.Name+" "+c.JSONPath)
		}
		Expect(columns).To(Equal([]string{"User .spec.user", "Identity .spec.identity", "TTL .spec.ttlSeconds",
			"Renewed .status.renewTime", "Locks .status.locks", "Age .metadata.creationTimestamp"}))

		// The markers cannot name the constants Go code uses.
		ttl := v.Schema.OpenAPIV3Schema.Properties["spec"].Properties["ttlSeconds"]
		Expect(string(ttl.Default.Raw)).To(Equal(fmt.Sprint(locksv1.DefaultSessionTTLSeconds)))
		Expect(*ttl.Minimum).To(BeEquivalentTo(locksv1.MinSessionTTLSeconds))
		Expect(*ttl.Maximum).To(BeEquivalentTo(locksv1.MaxSessionTTLSeconds))
	})

	It("round-trips spec and status, and defaults the TTL", func(ctx SpecContext) {
		s := newSession()
		s.Spec.PodName = "worker-7d9f"
		s.Spec.PodUID = "0b7e4b6c-6f3a-4d5e-9c1a-2f0e8d7c6b5a"
		want := s.Spec
		Expect(env.Client.Create(ctx, s)).To(Succeed())
		now := micro()
		s.Status = locksv1.LockSessionStatus{RenewTime: &now, Locks: 3}
		Expect(env.Client.Status().Update(ctx, s)).To(Succeed())
		var got locksv1.LockSession
		Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(s), &got)).To(Succeed())
		Expect(cmp.Diff(want, got.Spec)).To(BeEmpty())
		Expect(cmp.Diff(s.Status, got.Status)).To(BeEmpty())

		d := newSession()
		d.Spec.TTLSeconds = 0
		Expect(env.Client.Create(ctx, d)).To(Succeed())
		Expect(d.Spec.TTLSeconds).To(BeEquivalentTo(locksv1.DefaultSessionTTLSeconds))
		Expect(d.TTL()).To(BeEquivalentTo(locksv1.DefaultSessionTTLSeconds))
	})

	It("keeps spec immutable", func(ctx SpecContext) {
		s := newSession()
		Expect(env.Client.Create(ctx, s)).To(Succeed())
		for _, change := range []func(*locksv1.LockSession){
			func(s *locksv1.LockSession) { s.Spec.User = "mallory" },
			func(s *locksv1.LockSession) { s.Spec.TTLSeconds = 3600 },
			func(s *locksv1.LockSession) { s.Spec.PodUID = "forged" },
		} {
			c := s.DeepCopy()
			change(c)
			err := env.Client.Update(ctx, c)
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want 422, got %v", err)
			Expect(err.Error()).To(ContainSubstring("a session's spec is immutable"))
		}
	})

	DescribeTable("refuses an invalid session",
		func(ctx SpecContext, want string, mutate func(u map[string]any)) {
			u := sessionUnstructured(newSession())
			mutate(u.Object)
			err := env.Client.Create(ctx, u)
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want 422, got %v", err)
			Expect(err.Error()).To(ContainSubstring(want))
		},
		Entry("TTL below 5", "spec.ttlSeconds in body should be greater than or equal to 5",
			setSessionSpec("ttlSeconds", int64(4))),
		Entry("TTL above an hour", "spec.ttlSeconds in body should be less than or equal to 3600",
			setSessionSpec("ttlSeconds", int64(3601))),
		Entry("no user", "spec.user: Required value",
			func(u map[string]any) { unstructured.RemoveNestedField(u, "spec", "user") }),
		Entry("no spec", "spec: Required value", func(u map[string]any) { delete(u, "spec") }),
		Entry("an identity with a terminal escape", "spec.identity in body should match",
			setSessionSpec("identity", "w\x1b[2J")),
		Entry("a pod name with a newline", "spec.podName in body should match",
			setSessionSpec("podName", "pod\nroot")),
		Entry("a pod name that is no pod's name", "spec.podName in body should match '"+locksv1.PodNamePattern+"'",
			setSessionSpec("podName", "../../../../../version")),
		Entry("a pod UID that is no pod's UID", "spec.podUID in body should match '"+locksv1.PodUIDPattern+"'",
			setSessionSpec("podUID", "uid-worker-0")),
	)

	It("refuses a status Go cannot read or a negative count", func(ctx SpecContext) {
		s := newSession()
		Expect(env.Client.Create(ctx, s)).To(Succeed())
		u := sessionUnstructured(s)
		Expect(unstructured.SetNestedField(u.Object, "2026-11-29T09:00:00Z", "status", "renewTime")).To(Succeed())
		err := env.Client.Status().Update(ctx, u)
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want 422, got %v", err)
		u = sessionUnstructured(s)
		Expect(unstructured.SetNestedField(u.Object, int64(-1), "status", "locks")).To(Succeed())
		err = env.Client.Status().Update(ctx, u)
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want 422, got %v", err)
	})
})

var _ = Describe("a lock holding in a session", func() {
	It("round-trips holder.session and waiters[].session and ends with the session reasons", func(ctx SpecContext) {
		l := newLock()
		Expect(env.Client.Create(ctx, l)).To(Succeed())
		h := holder("alice", 1)
		h.Session = "session-a.b"
		acquire(ctx, env.Client, l, h)
		w := waiter("bob", 2)
		w.Session = "session-b"
		l.Status.Waiters = []locksv1.Waiter{w}
		l.Status.WaiterCount = 1
		Expect(env.Client.Status().Update(ctx, l)).To(Succeed())
		var got locksv1.DistributedLock
		Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(l), &got)).To(Succeed())
		Expect(got.Status.Holder.Session).To(Equal("session-a.b"))
		Expect(got.Status.Waiters[0].Session).To(Equal("session-b"))

		for _, reason := range []locksv1.EndReason{locksv1.EndReasonSessionExpired, locksv1.EndReasonSessionClosed} {
			got.EndHolding(reason, admin, micro())
			Expect(env.Client.Status().Update(ctx, &got)).To(Succeed())
			token, err := locksv1.NextFencingToken(got.ResourceVersion)
			Expect(err).NotTo(HaveOccurred())
			got.Acquire(holder("alice", 3), token)
			Expect(env.Client.Status().Update(ctx, &got)).To(Succeed())
		}
	})

	It("refuses a session name that is no object name", func(ctx SpecContext) {
		l := newLock()
		Expect(env.Client.Create(ctx, l)).To(Succeed())
		h := holder("alice", 1)
		h.Session = "Session_A"
		token, err := locksv1.NextFencingToken(l.ResourceVersion)
		Expect(err).NotTo(HaveOccurred())
		l.Acquire(h, token)
		err = env.Client.Status().Update(ctx, l)
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want 422, got %v", err)
		Expect(err.Error()).To(ContainSubstring("holder.session in body should match"))
	})
})

func setSessionSpec(field string, v any) func(map[string]any) {
	return func(u map[string]any) {
		Expect(unstructured.SetNestedField(u, v, "spec", field)).To(Succeed())
	}
}
