package integration

import (
	"context"
	"fmt"
	"math"
	"strconv"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/rules"
	"github.com/kubelock/kubelock/test/suite"
)

var _ = backends.Describe("Kubernetes objects fenced by a lock", Ordered, func() {
	BeforeAll(func(ctx SpecContext) {
		Expect(env.FencedObjectsWebhook(ctx)).To(Succeed())
	})

	// One lock, three holdings: alice, then bob (alice is now a stale holder),
	// with carol holding the force-release verb.
	It("refuses every route of a stale holder or a non-holder; the holder and a force-release user pass", func(ctx SpecContext) {
		ns := suite.Namespace(ctx)
		suite.NewLock(ctx, ns, "config-writer", locksv1alpha1.DistributedLockSpec{})
		type writer struct {
			name string
			c    client.Client
			lk   *lock.Client
		}
		newWriter := func() writer {
			cfg, name := suite.UserConfig(ctx)
			c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
			Expect(err).NotTo(HaveOccurred())
			lk, err := lock.New(cfg, lock.WithNamespace(ns), lock.WithIdentity(name))
			Expect(err).NotTo(HaveOccurred())
			return writer{name, c, lk}
		}
		alice, bob, carol := newWriter(), newWriter(), newWriter()
		grant(ctx, ns, "configmaps", []string{"", "get", "list", "create", "update", "patch", "delete"}, alice.name, bob.name, carol.name)
		grant(ctx, ns, "breakglass", []string{locksv1alpha1.GroupVersion.Group, locksv1alpha1.ForceReleaseVerb}, carol.name)

		key := client.ObjectKey{Namespace: ns, Name: "settings"}
		fencedCM := func(token int64, mode string) *corev1.ConfigMap {
			return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
				Namespace: ns, Name: key.Name,
				Labels:      map[string]string{locksv1alpha1.FencedLabel: "true"},
				Annotations: map[string]string{locksv1alpha1.FencedByAnnotation: "config-writer", locksv1alpha1.FencingTokenAnnotation: strconv.FormatInt(token, 10)},
			}, Data: map[string]string{"mode": mode}}
		}
		stored := func() *corev1.ConfigMap {
			cm := &corev1.ConfigMap{}
			Expect(env.Client.Get(ctx, key, cm)).To(Succeed())
			return cm
		}
		patch := func(w writer, p string) error {
			return w.c.Patch(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: key.Name}}, client.RawPatch(types.MergePatchType, []byte(p)))
		}
		apply := func(w writer, ann map[string]any) error {
			u := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "v1", "kind": "ConfigMap",
				"metadata": map[string]any{"namespace": ns, "name": key.Name,
					"labels": map[string]any{locksv1alpha1.FencedLabel: "true"}, "annotations": ann},
				"data": map[string]any{"mode": "applied by " + w.name},
			}}
			return w.c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(w.name), client.ForceOwnership)
		}
		// refused asserts a denial with the rule's tag that left the object as it was.
		refused := func(rule rules.Rule, write func() error, contains ...string) {
			GinkgoHelper()
			before := &corev1.ConfigMap{}
			errGet := env.Client.Get(ctx, key, before)
			err := write()
			Expect(apierrors.IsForbidden(err)).To(BeTrue(), "got %v", err)
			Expect(err.Error()).To(ContainSubstring("[kubelock:%s]", rule))
			for _, c := range contains {
				Expect(err.Error()).To(ContainSubstring(c))
			}
			after := &corev1.ConfigMap{}
			errAfter := env.Client.Get(ctx, key, after)
			Expect(apierrors.IsNotFound(errAfter)).To(Equal(apierrors.IsNotFound(errGet)))
			if errGet == nil {
				Expect(after.ResourceVersion).To(Equal(before.ResourceVersion))
			}
		}

		By("alice holds the lock and creates the fenced ConfigMap with her token")
		first, err := alice.lk.Acquire(ctx, "config-writer")
		Expect(err).NotTo(HaveOccurred())
		t1 := first.FencingToken()
		Expect(alice.c.Create(ctx, fencedCM(t1, "by alice"))).To(Succeed())
		Expect(patch(alice, `{"data":{"mode":"alice again"}}`)).To(Succeed())
		Expect(first.Release(ctx)).To(Succeed())

		By("bob holds it now; alice is a stale holder")
		second, err := bob.lk.Acquire(ctx, "config-writer")
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = second.Release(context.Background()) })
		t2 := second.FencingToken()
		hidden := strconv.FormatInt(t2, 10) // never shown to a non-holder

		refused(rules.RuleStaleToken, func() error { return patch(alice, `{"data":{"mode":"alice, data only"}}`) },
			"is not the current token of lock \"config-writer\"")
		Expect(patch(bob, `{"metadata":{"annotations":{"locks.kubelock.io/fencing-token":"`+hidden+`"}},"data":{"mode":"by bob"}}`)).To(Succeed())

		// The stored token is now bob's: carried over, it authorises nobody else.
		routes := []struct {
			name  string
			write func() error
		}{
			{"data-only patch", func() error { return patch(alice, `{"data":{"mode":"alice, data only"}}`) }},
			{"server-side apply", func() error {
				return apply(alice, map[string]any{locksv1alpha1.FencedByAnnotation: "config-writer"})
			}},
			{"label removal", func() error { return patch(alice, `{"metadata":{"labels":{"locks.kubelock.io/fenced":null}}}`) }},
			{"annotation removal", func() error {
				return patch(alice, `{"metadata":{"annotations":{"locks.kubelock.io/fenced-by":null}}}`)
			}},
			{"delete", func() error {
				return alice.c.Delete(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: key.Name}})
			}},
		}
		for _, r := range routes {
			By("alice: " + r.name)
			refused(rules.RuleFencedWriter, r.write, "does not hold lock \"config-writer\"")
		}
		By("alice: server-side apply with her own (stale) token")
		refused(rules.RuleStaleToken, func() error {
			return apply(alice, map[string]any{locksv1alpha1.FencedByAnnotation: "config-writer", locksv1alpha1.FencingTokenAnnotation: strconv.FormatInt(t1, 10)})
		}, "stale fencing token")
		By("bob: a forged token is refused without revealing the lock's token")
		err = patch(bob, `{"metadata":{"annotations":{"locks.kubelock.io/fencing-token":"`+strconv.FormatInt(math.MaxInt64, 10)+`"}}}`)
		Expect(err).To(MatchError(ContainSubstring("was never issued by lock \"config-writer\"")))
		Expect(err.Error()).NotTo(MatchRegexp(`\b%s\b`, hidden))
		Expect(stored().Annotations[locksv1alpha1.FencingTokenAnnotation]).To(Equal(hidden))

		By("the holder's server-side apply, and carol's update with the current token, pass")
		Expect(apply(bob, map[string]any{locksv1alpha1.FencedByAnnotation: "config-writer", locksv1alpha1.FencingTokenAnnotation: hidden})).To(Succeed())
		Expect(patch(carol, `{"data":{"mode":"fixed by carol (force-release)"}}`)).To(Succeed())
		refused(rules.RuleStaleToken, func() error {
			return patch(carol, `{"metadata":{"annotations":{"locks.kubelock.io/fencing-token":null}}}`)
		}, "must carry the holder's fencing token")

		By("the holder deletes; recreating is refused to the stale holder and to a copied token")
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: key.Name}}
		Expect(bob.c.Delete(ctx, cm)).To(Succeed())
		refused(rules.RuleStaleToken, func() error { return alice.c.Create(ctx, fencedCM(t1, "alice recreates")) }, "is not the current token")
		refused(rules.RuleFencedWriter, func() error { return alice.c.Create(ctx, fencedCM(t2, "alice recreates")) }, "does not hold")
		Expect(bob.c.Create(ctx, fencedCM(t2, "bob recreates"))).To(Succeed())

		By("alice holds again: bob's delete is stale; alice stamps the object with her token, then deletes")
		Expect(second.Release(ctx)).To(Succeed())
		third, err := alice.lk.Acquire(ctx, "config-writer")
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = third.Release(context.Background()) })
		t3 := strconv.FormatInt(third.FencingToken(), 10)
		refused(rules.RuleStaleToken, func() error { return bob.c.Delete(ctx, cm) }, "is not the current token")
		refused(rules.RuleStaleToken, func() error { return alice.c.Delete(ctx, cm) }, "writes its token into the object first")
		Expect(patch(alice, `{"metadata":{"annotations":{"locks.kubelock.io/fencing-token":"`+t3+`"}}}`)).To(Succeed())
		Expect(alice.c.Delete(ctx, cm)).To(Succeed())

		By("carol (force-release) recreates with the current token")
		Expect(carol.c.Create(ctx, fencedCM(third.FencingToken(), "carol recreates"))).To(Succeed())
		Expect(stored().Data["mode"]).To(Equal("carol recreates"))

		By("a namespace being deleted may be emptied by anyone who may delete (the namespace controller holds no lock)")
		refused(rules.RuleFencedWriter, func() error { return bob.c.Delete(ctx, cm) }, "does not hold")
		Expect(env.Client.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
		Expect(bob.c.Delete(ctx, cm)).To(Succeed())
	})

	// A ConfigMap writer's annotations on an object nobody fenced yet: the
	// webhook never saw them (objects without the fenced label are not sent to
	// it), yet the holder's write that fences the object was judged by them: a
	// planted fencing-token made it "stale" ("this object already accepted token
	// ..."), a planted fenced-by of another lock made it a move between locks.
	It("fences an object by the holder's write alone, whatever another writer annotated on it before", func(ctx SpecContext) {
		ns := suite.Namespace(ctx)
		suite.NewLock(ctx, ns, "db", locksv1alpha1.DistributedLockSpec{})
		suite.NewLock(ctx, ns, "other", locksv1alpha1.DistributedLockSpec{})
		malloryCfg, mallory := suite.UserConfig(ctx)
		bobCfg, bob := suite.UserConfig(ctx)
		grant(ctx, ns, "configmaps", []string{"", "get", "create", "update", "patch"}, mallory, bob)
		mc, err := client.New(malloryCfg, client.Options{Scheme: env.Scheme})
		Expect(err).NotTo(HaveOccurred())
		bc, err := client.New(bobCfg, client.Options{Scheme: env.Scheme})
		Expect(err).NotTo(HaveOccurred())
		lk, err := lock.New(bobCfg, lock.WithNamespace(ns), lock.WithIdentity(bob))
		Expect(err).NotTo(HaveOccurred())
		held, err := lk.Acquire(ctx, "db")
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = held.Release(context.Background()) })
		token := strconv.FormatInt(held.FencingToken(), 10)

		for i, planted := range []map[string]string{
			{locksv1alpha1.FencedByAnnotation: "db", locksv1alpha1.FencingTokenAnnotation: strconv.FormatInt(math.MaxInt64-1, 10)},
			{locksv1alpha1.FencedByAnnotation: "other", locksv1alpha1.FencingTokenAnnotation: "1"},
			{locksv1alpha1.FencedByAnnotation: "gone"},
		} {
			name := fmt.Sprintf("planted %v", planted)
			By(name)
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprint("settings-", i), Annotations: planted}}
			Expect(mc.Create(ctx, cm)).To(Succeed(), "no fenced label: the webhook is not asked")
			fence := `{"metadata":{"labels":{"` + locksv1alpha1.FencedLabel + `":"true"},"annotations":{"` +
				locksv1alpha1.FencedByAnnotation + `":"db","` + locksv1alpha1.FencingTokenAnnotation + `":"` + token + `"}}}`
			Expect(bc.Patch(ctx, cm, client.RawPatch(types.MergePatchType, []byte(fence)))).To(Succeed())
			By(name + ": fenced now, the other writer is refused")
			err := mc.Patch(ctx, cm, client.RawPatch(types.MergePatchType, []byte(`{"data":{"mode":"mallory"}}`)))
			Expect(apierrors.IsForbidden(err)).To(BeTrue(), "got %v", err)
		}
	})
})

// grant binds users to a Role in ns with one rule: rule[0] is the API group,
// the rest are verbs (on configmaps for group "", on distributedlocks otherwise).
func grant(ctx context.Context, ns, name string, rule []string, users ...string) {
	res := "configmaps"
	if rule[0] != "" {
		res = "distributedlocks"
	}
	Expect(env.Client.Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{rule[0]}, Resources: []string{res}, Verbs: rule[1:]}},
	})).To(Succeed())
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
	}
	for _, u := range users {
		rb.Subjects = append(rb.Subjects, rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: u})
	}
	Expect(env.Client.Create(ctx, rb)).To(Succeed())
}
