package admission

import (
	"context"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/rules"
)

// The red team's session holes: each one a hostile write about a session
// that the webhook denies with its rule's message. Where the policy engine
// cannot read the session (policyAdmits), the controller ends what it admitted
// (controllers' TestDecideSessionHoldings).

// longSessionHolding creates a session of u with the longest TTL (3600 s)
// and holds a lock of the default spec (maxLeaseDurationSeconds 300) in it,
// with a short, in-bounds holder.leaseDurationSeconds: a holder that dies
// would keep the lock for an hour instead of at most five minutes.
func longSessionHolding(ctx context.Context, u *user, s *locksv1alpha1.LockSession) error {
	s.Name += "-long"
	s.Spec.TTLSeconds = locksv1alpha1.MaxLeaseDurationSeconds
	if err := u.c.Create(ctx, s); err != nil {
		return err
	}
	return acquireIn()(ctx, u, s)
}

func redteamSessionEntries() []TableEntry {
	session := tag(rules.RuleSession)
	return []TableEntry{
		Entry("hold a lock past its maxLeaseDurationSeconds in a session with a longer TTL", sessionHostile{by: "alice", do: longSessionHolding,
			want: []string{session + "session ", " has ttlSeconds 3600, more than the lock's spec.maxLeaseDurationSeconds 300"}, policyAdmits: true, lock: true}),
		// A pod's holding in a session its service account made without a pod
		// would live on after the pod: the unbound credential (or anyone of the
		// account recreating a gone pod session's name) keeps it renewed.
		Entry("a pod holds in a session of its service account bound to no pod", sessionHostile{owner: unboundPod, by: podSA,
			do:   acquireIn(pod0Name, pod0UID),
			want: []string{session + "session ", ` is bound to no pod; a holding or waiter of pod UID "` + pod0UID + `" must be in a session of that pod`}, policyAdmits: true, lock: true}),
		// A token of the account bound to no pod forges the pod's UID to hold
		// in the pod's session: a holding that pod neither knows nor can end
		// (not its own request), kept alive by its renewals. A token bound to
		// no pod writes no pod fields at all.
		Entry("a token bound to no pod holds in its account's pod session with the pod's UID", sessionHostile{owner: podSA, by: unboundPod,
			do:   acquireIn(pod0Name, pod0UID),
			want: []string{tag(rules.RulePodBinding) + `holder.podName "` + pod0Name + `" ` + rules.MsgNoPodToken}, lock: true}),
		// The controller caches every session: 16 annotations of 16 kB each
		// cost it 250 kB per session, where a client writes none.
		Entry("red team 3: a session with 250 kB of annotations", sessionHostile{by: "alice",
			do:   createSessionAs(func(s *locksv1alpha1.LockSession) { s.Annotations, _ = bigAnnotations(16, 15900) }),
			want: []string{session + "a session's annotations take at most 4096 bytes, keys and values together"}}),
	}
}

var _ = Describe("session admission, red team", Ordered, ContinueOnFailure, func() {
	BeforeAll(func(ctx SpecContext) {
		Expect(client.IgnoreAlreadyExists(env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: podNamespace}}))).To(Succeed())
	})
	for _, e := range crdEngines {
		redteamSessionSpecs(e)
	}
})

// redteamSessionSpecs are the red team's session table, with engine e.
func redteamSessionSpecs(e engine) {
	Context("with the "+string(e)+" engine", func() {
		var ns string
		BeforeAll(func(ctx SpecContext) {
			activate(ctx, e)
			ns = namespace(ctx, "sessrt-"+string(e))
		})

		DescribeTable("rejects a hostile session write",
			func(ctx SpecContext, h sessionHostile) { checkSessionHostile(ctx, e, ns, h) },
			redteamSessionEntries(),
		)
	})
}
