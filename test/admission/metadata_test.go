package admission

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/google/go-cmp/cmp"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/rules"
	"github.com/kubelock/kubelock/test/testenv"
)

// The main resource's rules: the force-delete
// annotation, finalizers of held locks, and what lock users may create.

const keepFinalizer = "example.com/keep"

// metaHostile is a write to a lock's metadata, or a create, that both engines deny.
type metaHostile struct {
	state state
	// setup, if set, brings the built lock further as the administrator.
	setup func(ctx context.Context, key client.ObjectKey)
	// by names the writer.
	by string
	// do writes to the lock at key (for creates: creates a lock named key).
	do func(ctx context.Context, u *user, key client.ObjectKey) error
	// create: the case creates a lock, so the table checks that none exists afterwards.
	create bool
	want   []string
}

var (
	metaHeld          = state{holder: "alice"}
	metaHeldFinalized = state{holder: "alice", finalizers: []string{keepFinalizer}}
	metaHeldNotForced = state{holder: "alice", annotations: map[string]string{locksv1alpha1.ForceDeleteAnnotation: "false"}}
)

func tagOf(r rules.Rule) string { return "[kubelock:" + string(r) + "] " }

func metaPatch(pt types.PatchType, body any) func(context.Context, *user, client.ObjectKey) error {
	return func(ctx context.Context, u *user, key client.ObjectKey) error {
		b, err := json.Marshal(body)
		Expect(err).NotTo(HaveOccurred())
		l := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
		return u.c.Patch(ctx, l, client.RawPatch(pt, b))
	}
}

// metaUpdate reads the lock as u, edits it and writes the main resource back.
func metaUpdate(edit func(*locksv1alpha1.DistributedLock)) func(context.Context, *user, client.ObjectKey) error {
	return func(ctx context.Context, u *user, key client.ObjectKey) error {
		l := &locksv1alpha1.DistributedLock{}
		if err := u.c.Get(ctx, key, l); err != nil {
			return err
		}
		edit(l)
		return u.c.Update(ctx, l)
	}
}

// createAs creates a lock named key.Name with spec and the edits in meta.
func createAs(spec locksv1alpha1.DistributedLockSpec, meta func(*metav1.ObjectMeta)) func(context.Context, *user, client.ObjectKey) error {
	return func(ctx context.Context, u *user, key client.ObjectKey) error {
		l := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}, Spec: spec}
		if meta != nil {
			meta(&l.ObjectMeta)
		}
		return u.c.Create(ctx, l)
	}
}

// applyMeta server-side applies metadata to the lock at key as u.
func applyMeta(meta map[string]any) func(context.Context, *user, client.ObjectKey) error {
	return func(ctx context.Context, u *user, key client.ObjectKey) error {
		meta["namespace"], meta["name"] = key.Namespace, key.Name
		obj := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": locksv1alpha1.GroupVersion.String(), "kind": "DistributedLock", "metadata": meta,
		}}
		return u.c.Apply(ctx, client.ApplyConfigurationFromUnstructured(obj), client.FieldOwner(u.name+"-apply"), client.ForceOwnership)
	}
}

func deleteAs(ctx context.Context, u *user, key client.ObjectKey) error {
	return u.c.Delete(ctx, &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}})
}

func forceAnnotation(v string) func(*metav1.ObjectMeta) {
	return func(m *metav1.ObjectMeta) { m.Annotations = map[string]string{locksv1alpha1.ForceDeleteAnnotation: v} }
}

// autoCreateMeta is what pkg/lock puts on a lock it creates.
func autoCreateMeta(m *metav1.ObjectMeta) {
	m.Labels = map[string]string{locksv1alpha1.AutoCreatedLabel: "true"}
	m.Annotations = map[string]string{locksv1alpha1.KeyAnnotation: "orders/4711"}
}

func forceDeleteDenied(u string) string {
	return tagOf(rules.RuleForceDelete) + `user "` + u + `" may not set the locks.kubelock.io/force-delete annotation (to "true"): it needs the "force-release" verb`
}

func createDenied(u, sets string) []string {
	return []string{
		tagOf(rules.RuleCreate) + `user "` + u + `" may create a lock only with the default spec, no finalizers and no locks.kubelock.io/force-delete annotation (anything else needs the "update" verb`,
		" sets " + sets,
	}
}

// The auto-created label's denials, as both engines word them.
const (
	autoCreatedSpecOnly = "the label marks a client's create on first use, with the default spec; declare the lock without it"
	autoCreatedAdded    = "[kubelock:create] the locks.kubelock.io/auto-created label marks a client's create on first use: no update adds it to a lock"
)

// labelled: the administrator sets the auto-created label to v.
func labelled(v string) func(context.Context, client.ObjectKey) {
	return func(ctx context.Context, key client.ObjectKey) {
		l := get(ctx, key)
		l.Labels = map[string]string{locksv1alpha1.AutoCreatedLabel: v}
		Expect(env.Client.Update(ctx, l)).To(Succeed())
	}
}

func heldFinalizerDenied() []string {
	return []string{
		tagOf(rules.RuleHeldDelete) + "lock ",
		" is held by alice (lease " + leaseID("alice", 1) + "); removing its finalizers " + keepFinalizer + " is a delete: release it first",
	}
}

func metaEntries() []TableEntry {
	forceTrue := map[string]any{"metadata": map[string]any{"annotations": map[string]any{locksv1alpha1.ForceDeleteAnnotation: "true"}}}
	return []TableEntry{
		// --- class 6: the force-delete annotation and held deletes ---------------------
		Entry("a lock user with patch adds the force-delete annotation to a held lock (merge patch)", metaHostile{state: metaHeld, by: "mallory",
			do: metaPatch(types.MergePatchType, forceTrue), want: []string{forceDeleteDenied("mallory")}}),
		Entry("a lock user with patch adds the force-delete annotation (JSON patch)", metaHostile{state: free, by: "mallory",
			do:   metaPatch(types.JSONPatchType, []map[string]any{{"op": "add", "path": "/metadata/annotations", "value": map[string]string{locksv1alpha1.ForceDeleteAnnotation: "true"}}}),
			want: []string{forceDeleteDenied("mallory")}}),
		Entry("a lock user with update adds the force-delete annotation (update)", metaHostile{state: metaHeld, by: "mallory",
			do: metaUpdate(func(l *locksv1alpha1.DistributedLock) {
				l.Annotations = map[string]string{locksv1alpha1.ForceDeleteAnnotation: "true"}
			}),
			want: []string{forceDeleteDenied("mallory")}}),
		Entry("a lock user with patch server-side applies the force-delete annotation", metaHostile{state: metaHeld, by: "mallory",
			do:   applyMeta(map[string]any{"annotations": map[string]any{locksv1alpha1.ForceDeleteAnnotation: "true"}}),
			want: []string{forceDeleteDenied("mallory")}}),
		Entry("a lock user changes force-delete from false to true", metaHostile{state: metaHeldNotForced, by: "mallory",
			do: metaPatch(types.MergePatchType, forceTrue), want: []string{forceDeleteDenied("mallory")}}),
		Entry("a lock user creates a lock with the force-delete annotation", metaHostile{by: "alice", create: true,
			do: createAs(locksv1alpha1.DistributedLockSpec{}, forceAnnotation("true")), want: []string{forceDeleteDenied("alice")}}),
		Entry("a lock user with update creates a lock with the force-delete annotation", metaHostile{by: "mallory", create: true,
			do: createAs(locksv1alpha1.DistributedLockSpec{}, forceAnnotation("true")), want: []string{forceDeleteDenied("mallory")}}),
		Entry("a lock user with patch removes the finalizer of a held lock (JSON patch)", metaHostile{state: metaHeldFinalized, by: "mallory",
			do:   metaPatch(types.JSONPatchType, []map[string]any{{"op": "remove", "path": "/metadata/finalizers"}}),
			want: heldFinalizerDenied()}),
		Entry("a lock user with update removes the finalizer of a held lock (update)", metaHostile{state: metaHeldFinalized, by: "mallory",
			do: metaUpdate(func(l *locksv1alpha1.DistributedLock) { l.Finalizers = nil }), want: heldFinalizerDenied()}),
		Entry("a lock user removes the finalizer of a held lock and adds force-delete in one write", metaHostile{state: metaHeldFinalized, by: "mallory",
			do: metaPatch(types.MergePatchType, map[string]any{"metadata": map[string]any{
				"finalizers": nil, "annotations": map[string]any{locksv1alpha1.ForceDeleteAnnotation: "true"},
			}}),
			want: []string{forceDeleteDenied("mallory")}}),
		Entry("a lock user with delete deletes a held lock", metaHostile{state: metaHeld, by: "mallory", do: deleteAs,
			want: []string{tagOf(rules.RuleHeldDelete) + "lock ", " is held by alice (lease " + leaseID("alice", 1) + "); release it first"}}),
		Entry("a lock user with delete deletes a lock only readers hold", metaHostile{state: state{spec: rwSpec, readers: []string{"alice", "bob"}}, by: "mallory", do: deleteAs,
			want: []string{tagOf(rules.RuleHeldDelete) + "lock ", " is held by alice (lease " + leaseID("alice", 1) + "); release it first"}}),
		Entry("a lock user with update removes the finalizer of a Semaphore whose permits are held", metaHostile{
			state: state{spec: sem3Spec, readers: []string{"alice"}, finalizers: []string{keepFinalizer}}, by: "mallory",
			do: metaUpdate(func(l *locksv1alpha1.DistributedLock) { l.Finalizers = nil }), want: heldFinalizerDenied()}),

		// --- class 9: lock users squat locks with their create -------------------------
		Entry("a lock user creates a lock with a 3600 s lease", metaHostile{by: "alice", create: true,
			do:   createAs(locksv1alpha1.DistributedLockSpec{LeaseDurationSeconds: 3600, MaxLeaseDurationSeconds: 3600}, autoCreateMeta),
			want: createDenied("alice", "spec.leaseDurationSeconds=3600 (default 30), spec.maxLeaseDurationSeconds=3600 (default 300)")}),
		Entry("a lock user creates a lock nobody may wait for (maxWaiters 0)", metaHostile{by: "alice", create: true,
			do:   createAs(locksv1alpha1.DistributedLockSpec{MaxWaiters: int32p(0)}, autoCreateMeta),
			want: createDenied("alice", "spec.maxWaiters=0 (default 128)")}),
		Entry("a lock user creates a lock with a 3600 s hand-off", metaHostile{by: "alice", create: true,
			do:   createAs(locksv1alpha1.DistributedLockSpec{HandoffTimeoutSeconds: 3600}, nil),
			want: createDenied("alice", "spec.handoffTimeoutSeconds=3600 (default 10)")}),
		Entry("a lock user creates an RWMutex", metaHostile{by: "alice", create: true,
			do:   createAs(rwSpec, autoCreateMeta),
			want: createDenied("alice", "spec.type=RWMutex (default Mutex)")}),
		Entry("a lock user creates a Semaphore of 3 permits", metaHostile{by: "alice", create: true,
			do:   createAs(sem3Spec, autoCreateMeta),
			want: createDenied("alice", "spec.type=Semaphore (default Mutex), spec.permits=3")}),
		Entry("a lock user creates a lock with a finalizer", metaHostile{by: "alice", create: true,
			do:   createAs(locksv1alpha1.DistributedLockSpec{}, func(m *metav1.ObjectMeta) { m.Finalizers = []string{keepFinalizer} }),
			want: createDenied("alice", "metadata.finalizers")}),
		// --- the auto-created label: the controller deletes such a lock once idle ------------
		Entry("an administrator creates a lock with the auto-created label and maxWaiters 0", metaHostile{by: "lockadmin", create: true,
			do:   createAs(locksv1alpha1.DistributedLockSpec{MaxWaiters: int32p(0)}, autoCreateMeta),
			want: []string{tagOf(rules.RuleCreate) + "lock ", " carries the locks.kubelock.io/auto-created label with spec.maxWaiters=0 (default 128): " + autoCreatedSpecOnly}}),
		Entry("an administrator adds the auto-created label to a lock (merge patch)", metaHostile{state: free, by: "lockadmin",
			do:   metaPatch(types.MergePatchType, map[string]any{"metadata": map[string]any{"labels": map[string]any{locksv1alpha1.AutoCreatedLabel: "true"}}}),
			want: []string{autoCreatedAdded}}),
		Entry("an administrator server-side applies the auto-created label to a lock", metaHostile{state: free, by: "lockadmin",
			do:   applyMeta(map[string]any{"labels": map[string]any{locksv1alpha1.AutoCreatedLabel: "true"}}),
			want: []string{autoCreatedAdded}}),
		Entry("a lock user with update turns the auto-created label from false to true", metaHostile{
			state: free, setup: labelled("false"), by: "mallory",
			do:   metaUpdate(func(l *locksv1alpha1.DistributedLock) { l.Labels[locksv1alpha1.AutoCreatedLabel] = "true" }),
			want: []string{autoCreatedAdded}}),
		Entry("a pod's service account creates a lock with all of it", metaHostile{by: podSA, create: true,
			do: createAs(locksv1alpha1.DistributedLockSpec{LeaseDurationSeconds: 3600, MaxLeaseDurationSeconds: 3600, MaxWaiters: int32p(0), HandoffTimeoutSeconds: 3600},
				func(m *metav1.ObjectMeta) { m.Finalizers = []string{keepFinalizer} }),
			want: createDenied(podSA, "spec.leaseDurationSeconds=3600 (default 30), spec.maxLeaseDurationSeconds=3600 (default 300), "+
				"spec.maxWaiters=0 (default 128), spec.handoffTimeoutSeconds=3600 (default 10), metadata.finalizers")}),
	}
}

// metaMessages[entry][engine] is the denial of each hostile entry, for the
// comparison of the two engines' words.
var metaMessages = map[string]map[engine]string{}

var (
	metaNamespaceRE = regexp.MustCompile(`meta-(webhook|policy)-[a-z0-9]+`)
	metaLockRE      = regexp.MustCompile(`\b(squat|lock)-[0-9]+\b`)
)

// metaDenial is the rule text of a denial, with the engine's wrapping, the
// namespace and the lock's name taken out.
func metaDenial(err error) string {
	_, m, found := strings.Cut(err.Error(), "[kubelock:")
	Expect(found).To(BeTrue(), "no rule tag in %v", err)
	m = "[kubelock:" + m
	m = metaNamespaceRE.ReplaceAllString(m, "NS")
	return metaLockRE.ReplaceAllString(m, "LOCK")
}

var _ = Describe("main-resource admission", Ordered, ContinueOnFailure, func() {
	It("gives lock users only the lock-user role of config/rbac", func(ctx SpecContext) {
		shipped := &rbacv1.ClusterRole{}
		readYAML(filepath.Join(testenv.RepoRoot(), "config", "rbac", "lock_user_role.yaml"), shipped)
		installed := &rbacv1.ClusterRole{}
		Expect(env.Client.Get(ctx, client.ObjectKey{Name: testenv.LockUserRole}, installed)).To(Succeed())
		Expect(installed.Rules).To(Equal(shipped.Rules))
		l := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "x"}}
		err := alice.c.Patch(ctx, l, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"locks.kubelock.io/force-delete":"true"}}}`)))
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "RBAC lets a plain lock user patch: %v", err)
		Expect(err).To(MatchError(ContainSubstring(`User "alice" cannot patch resource "distributedlocks"`)))
	})

	for _, e := range crdEngines {
		metaSpecs(e)
	}

	It("words each denial the same in both engines", func() {
		compared := 0
		for entry, m := range metaMessages {
			w, p := m[engineWebhook], m[enginePolicy]
			if w == "" || p == "" {
				continue // one engine was focused out
			}
			compared++
			// The policy says the first failing rule; the webhook says every
			// failing rule, the same first one included.
			Expect(w).To(ContainSubstring(strings.TrimSuffix(p, "]")), entry)
			Expect(w[:len("[kubelock:")+12]).To(Equal(p[:len("[kubelock:")+12]), entry)
		}
		Expect(compared).To(BeNumerically(">=", 10), "hostile entries denied by both engines")
	})
})

// metaSpecs are the table of creates, metadata writes and deletes, and the
// admitted ones, with engine e.
func metaSpecs(e engine) {
	Context("with the "+string(e)+" engine", func() {
		var ns string
		BeforeAll(func(ctx SpecContext) {
			activate(ctx, e)
			ns = namespace(ctx, "meta-"+string(e))
		})

		DescribeTable("rejects a hostile create, metadata write or delete and leaves the lock unchanged",
			func(ctx SpecContext, h metaHostile) {
				var key client.ObjectKey
				var before *locksv1alpha1.DistributedLock
				var beforeRaw []byte
				if h.create {
					key = client.ObjectKey{Namespace: ns, Name: "squat-" + randomSuffix()}
				} else {
					key = h.state.build(ctx, ns)
					if h.setup != nil {
						h.setup(ctx, key)
					}
					before, beforeRaw = get(ctx, key), getRaw(ctx, key)
				}

				err := h.do(ctx, who(h.by), key)
				Expect(err).To(HaveOccurred(), "the write was admitted")
				Expect(isDenial(err)).To(BeTrue(), "not a denial: %v", err)
				for _, w := range h.want {
					Expect(err.Error()).To(ContainSubstring(w))
				}
				Expect(err.Error()).To(ContainSubstring(denialPrefix(e)), "the engine under test said it")
				GinkgoWriter.Printf("%s engine: %v\n", e, err)
				AddReportEntry("message", err.Error(), ReportEntryVisibilityNever)
				entry := CurrentSpecReport().LeafNodeText
				if metaMessages[entry] == nil {
					metaMessages[entry] = map[engine]string{}
				}
				metaMessages[entry][e] = metaDenial(err)

				if h.create {
					err := env.Client.Get(ctx, key, &locksv1alpha1.DistributedLock{})
					Expect(apierrors.IsNotFound(err)).To(BeTrue(), "a denied create stored a lock: %v", err)
					return
				}
				after, afterRaw := get(ctx, key), getRaw(ctx, key)
				Expect(after.ResourceVersion).To(Equal(before.ResourceVersion))
				Expect(cmp.Diff(before, after)).To(BeEmpty())
				Expect(string(afterRaw)).To(Equal(string(beforeRaw)))
			},
			metaEntries(),
		)

		It("lets an administrator (update verb) create a lock with any spec and finalizer", func(ctx SpecContext) {
			key := client.ObjectKey{Namespace: ns, Name: "admin-" + randomSuffix()}
			spec := locksv1alpha1.DistributedLockSpec{Type: locksv1alpha1.Semaphore, Permits: int32p(5),
				LeaseDurationSeconds: 3600, MaxLeaseDurationSeconds: 3600, MaxWaiters: int32p(0), HandoffTimeoutSeconds: 3600, MaxWaitersPerUser: int32p(0), MaxWaitSeconds: 60}
			Expect(createAs(spec, func(m *metav1.ObjectMeta) { m.Finalizers = []string{keepFinalizer} })(ctx, lockadmin, key)).To(Succeed())
			got := get(ctx, key)
			Expect(got.Spec).To(Equal(spec))
			Expect(got.Finalizers).To(Equal([]string{keepFinalizer}))
		})

		It("lets a lock user create a lock with the default spec, as pkg/lock auto-creates it", func(ctx SpecContext) {
			key := client.ObjectKey{Namespace: ns, Name: "plain-" + randomSuffix()}
			Expect(createAs(locksv1alpha1.DistributedLockSpec{}, autoCreateMeta)(ctx, alice, key)).To(Succeed())
			Expect(get(ctx, key).Labels).To(HaveKeyWithValue(locksv1alpha1.AutoCreatedLabel, "true"))
			explicit := client.ObjectKey{Namespace: ns, Name: "explicit-" + randomSuffix()}
			defaults := locksv1alpha1.DistributedLockSpec{LeaseDurationSeconds: 30, MaxLeaseDurationSeconds: 300, MaxWaiters: int32p(128), HandoffTimeoutSeconds: 10}
			Expect(createAs(defaults, nil)(ctx, bob, explicit)).To(Succeed(), "the defaults written out")

			c, err := lock.New(carol.cfg, lock.WithNamespace(ns), lock.WithAutoCreate(), lock.WithIdentity("carol"))
			Expect(err).NotTo(HaveOccurred())
			l, err := c.TryAcquire(ctx, "orders/"+randomSuffix())
			Expect(err).NotTo(HaveOccurred())
			Expect(l.Release(ctx)).To(Succeed())
		})

		It("lets a force-release user add the annotation, after which a deleter may delete the held lock", func(ctx SpecContext) {
			key := metaHeld.build(ctx, ns)
			Expect(metaPatch(types.MergePatchType, map[string]any{"metadata": map[string]any{"annotations": map[string]any{
				locksv1alpha1.ForceDeleteAnnotation: "true",
			}}})(ctx, operator, key)).To(Succeed())
			Expect(deleteAs(ctx, mallory, key)).To(Succeed())
			Expect(apierrors.IsNotFound(env.Client.Get(ctx, key, &locksv1alpha1.DistributedLock{}))).To(BeTrue())

			key = metaHeld.build(ctx, ns)
			Expect(deleteAs(ctx, operator, key)).To(Succeed(), "force-release deletes a held lock directly")
		})

		It("lets a lock user remove the force-delete annotation, and a finalizer of a free lock", func(ctx SpecContext) {
			key := state{holder: "alice", annotations: map[string]string{locksv1alpha1.ForceDeleteAnnotation: "true"}}.build(ctx, ns)
			Expect(metaPatch(types.JSONPatchType, []map[string]any{{"op": "remove", "path": "/metadata/annotations"}})(ctx, mallory, key)).To(Succeed())
			Expect(get(ctx, key).Annotations).NotTo(HaveKey(locksv1alpha1.ForceDeleteAnnotation))

			key = state{finalizers: []string{keepFinalizer}}.build(ctx, ns)
			Expect(deleteAs(ctx, mallory, key)).To(Succeed(), "a free lock")
			Expect(get(ctx, key).DeletionTimestamp).NotTo(BeNil())
			Expect(metaUpdate(func(l *locksv1alpha1.DistributedLock) { l.Finalizers = nil })(ctx, mallory, key)).To(Succeed())
			Eventually(func() bool { return apierrors.IsNotFound(env.Client.Get(ctx, key, &locksv1alpha1.DistributedLock{})) }).Should(BeTrue())
		})

		It("never lets the finalizer dance end a holding silently", func(ctx SpecContext) {
			// Put a finalizer on a free lock and delete it: it is Terminating.
			key := free.build(ctx, ns)
			Expect(metaPatch(types.MergePatchType, map[string]any{"metadata": map[string]any{"finalizers": []string{keepFinalizer}}})(ctx, mallory, key)).To(Succeed())
			Expect(deleteAs(ctx, mallory, key)).To(Succeed())
			Expect(get(ctx, key).DeletionTimestamp).NotTo(BeNil())

			// Someone acquires the Terminating lock. The status rules (rule
			// `terminating`) deny this; where they
			// let it pass, the finalizer must stay while the lock is held.
			if err := write(ctx, alice, key, acquire(holder("alice", 1))); err != nil {
				Expect(err).To(MatchError(ContainSubstring("[kubelock:terminating]")))
				Expect(metaUpdate(func(l *locksv1alpha1.DistributedLock) { l.Finalizers = nil })(ctx, mallory, key)).To(Succeed())
				return
			}
			beforeRaw := getRaw(ctx, key)
			err := metaUpdate(func(l *locksv1alpha1.DistributedLock) { l.Finalizers = nil })(ctx, mallory, key)
			Expect(err).To(MatchError(ContainSubstring(heldFinalizerDenied()[1])))
			Expect(err).To(MatchError(ContainSubstring(denialPrefix(e))))
			Expect(string(getRaw(ctx, key))).To(Equal(string(beforeRaw)))

			// Once released, the pending delete completes.
			Expect(write(ctx, alice, key, end(locksv1alpha1.EndReasonReleased, "alice"))).To(Succeed())
			Expect(metaUpdate(func(l *locksv1alpha1.DistributedLock) { l.Finalizers = nil })(ctx, mallory, key)).To(Succeed())
			Eventually(func() bool { return apierrors.IsNotFound(env.Client.Get(ctx, key, &locksv1alpha1.DistributedLock{})) }).Should(BeTrue())
		})

		It("admits spec and label edits of a held lock without asking the webhook", func(ctx SpecContext) {
			key := metaHeld.build(ctx, ns)
			before := webhookRequests.Load()
			Expect(metaUpdate(func(l *locksv1alpha1.DistributedLock) {
				l.Spec.HandoffTimeoutSeconds = 20
				l.Labels = map[string]string{"team": "orders"}
				l.Annotations = map[string]string{"note": "resized"}
			})(ctx, lockadmin, key)).To(Succeed())
			Expect(webhookRequests.Load()-before).To(BeZero(), "matchConditions keep spec edits away from the webhook")
			Expect(get(ctx, key).Spec.HandoffTimeoutSeconds).To(Equal(int32(20)))
		})
	})
}

// randomSuffix is unique within the suite.
func randomSuffix() string { return fmt.Sprint(lockCounter.Add(1)) }
