package cli

import (
	"context"
	"encoding/json"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/gbytes"
	"github.com/onsi/gomega/gexec"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	icli "github.com/kubelock/kubelock/cmd/kubelock/cli"
	"github.com/kubelock/kubelock/test/suite"
)

var _ = Describe("kubelock sessions and force-release --session", func() {
	ctx := context.Background()
	var ns string
	suite.NamespaceEach(&ns)

	// newSession creates a session of its own as a fresh lock user.
	newSession := func() (user, *locksv1alpha1.LockSession) {
		cfg, name := suite.UserConfig(ctx)
		c, err := client.New(cfg, client.Options{Scheme: env.Client.Scheme()})
		Expect(err).NotTo(HaveOccurred())
		s := &locksv1alpha1.LockSession{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: name + "-"},
			Spec:       locksv1alpha1.LockSessionSpec{User: name, Identity: name, TTLSeconds: 300},
		}
		Expect(c.Create(ctx, s)).To(Succeed())
		return user{name: name, kubeconfig: writeKubeconfig(name, cfg)}, s
	}

	It("lists sessions as a table, JSON or names, and a break-glass operator ends one", func() {
		alice, s := newSession()
		tbl := kl(alice, ns, "sessions")
		Expect(tbl).To(gexec.Exit(0), "%s", tbl.Err.Contents())
		Expect(tbl.Out).To(gbytes.Say(`NAME\s+USER\s+IDENTITY\s+TTL\s+RENEWED\s+LOCKS\s+AGE\n`))
		Expect(tbl.Out).To(gbytes.Say(s.Name + `\s+` + alice.name + `\s+` + alice.name + `\s+5m\s+-\s+0\s+\d+s\n`))

		names := kl(alice, ns, "sessions", "-o", "name")
		Expect(names).To(gexec.Exit(0))
		Expect(string(names.Out.Contents())).To(Equal("locksessions.locks.kubelock.io/" + s.Name + "\n"))

		js := kl(alice, ns, "sessions", "-o", "json")
		Expect(js).To(gexec.Exit(0))
		var list locksv1alpha1.LockSessionList
		Expect(json.Unmarshal(js.Out.Contents(), &list)).To(Succeed())
		Expect(list.Kind).To(Equal("LockSessionList"))
		Expect(list.Items).To(HaveLen(1))
		Expect(list.Items[0].Spec.User).To(Equal(alice.name))

		carol := breakglass(ctx, ns)
		fr := kl(carol, ns, "force-release", "--session", s.Name)
		Expect(fr).To(gexec.Exit(0), "%s", fr.Err.Contents())
		Expect(fr.Out).To(gbytes.Say(`force-released session ` + ns + `/` + s.Name + ` of ` + alice.name + ` \(` + alice.name + `\): 0 lock\(s\) held in it end with SessionClosed\n`))
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(s), &locksv1alpha1.LockSession{})
		Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the session is deleted: %v", err)

		empty := kl(alice, ns, "sessions")
		Expect(empty).To(gexec.Exit(0))
		Expect(string(empty.Err.Contents())).To(Equal("No sessions found in namespace " + ns + ".\n"))
	})

	It("holds three locks in one session, describes the holding's session, and force-release --session ends all three", func() {
		alice := lockUser(ctx)
		acq := kl(alice, ns, "acquire", "a", "b", "c", "--create", "--session-ttl", "5m", "-o", "json")
		Expect(acq).To(gexec.Exit(0), "%s", acq.Err.Contents())
		var leases []struct {
			Name, Session string
			FencingToken  int64
		}
		Expect(json.Unmarshal(acq.Out.Contents(), &leases)).To(Succeed())
		Expect(leases).To(HaveLen(3))
		sess := leases[0].Session
		Expect(sess).NotTo(BeEmpty())
		for _, l := range leases {
			Expect(l.Session).To(Equal(sess))
			Expect(suite.GetLock(ctx, ns, l.Name).Status.Holder.Session).To(Equal(sess))
		}
		Eventually(func() string { return string(kl(alice, ns, "sessions").Out.Contents()) }).
			Should(MatchRegexp(sess + `\s+` + alice.name + `\s+` + alice.name + `\s+5m\s+\S+\s+3\s`))

		desc := kl(alice, ns, "describe", "b")
		Expect(desc).To(gexec.Exit(0))
		Expect(desc.Out).To(gbytes.Say(`Session:\s+` + sess + ` \(of ` + alice.name + `, TTL 5m, never renewed, 3 locks\)\n`))
		Expect(desc.Out).To(gbytes.Say(`Expires:\s+with its session`))
		get := kl(alice, ns, "get", "b")
		Expect(get.Out).To(gbytes.Say(`b\s+Mutex\s+1\s+` + alice.name + `\s+\d+\s+session\s+0\s+`))

		fr := kl(breakglass(ctx, ns), ns, "force-release", "--session", sess)
		Expect(fr).To(gexec.Exit(0), "%s", fr.Err.Contents())
		Expect(fr.Out).To(gbytes.Say(`3 lock\(s\) held in it end with SessionClosed\n  a \(token \d+, lease [0-9a-f]{32}\)\n  b .*\n  c .*\n`))
		for _, l := range leases {
			Eventually(func() *locksv1alpha1.LockHolder { return suite.GetLock(ctx, ns, l.Name).Status.Holder }).Should(BeNil())
			ra := suite.GetLock(ctx, ns, l.Name).Status.RecentAcquisitions
			Expect(ra[len(ra)-1].EndReason).To(Equal(locksv1alpha1.EndReasonSessionClosed))
		}
	})

	DescribeTable("force-release --session: one line on stderr and a distinct exit code",
		func(setup func(s *locksv1alpha1.LockSession) (user, []string), code int, msg string) {
			_, s := newSession()
			u, args := setup(s)
			out := kl(u, ns, args...)
			Expect(out).To(gexec.Exit(code), "stderr: %s", out.Err.Contents())
			Expect(stderrLines(out)).To(ConsistOf(And(HavePrefix("kubelock: "), ContainSubstring(msg))))
			Expect(out.Out.Contents()).To(BeEmpty())
		},
		Entry("no permission to delete sessions (RBAC)", func(s *locksv1alpha1.LockSession) (user, []string) {
			return nobody(), []string{"force-release", "--session", s.Name}
		}, icli.ExitDenied, "forbidden"),
		Entry("someone else's session without the verb (admission)", func(s *locksv1alpha1.LockSession) (user, []string) {
			return lockUser(context.Background()), []string{"force-release", "--session", s.Name}
		}, icli.ExitDenied, "[kubelock:session]"),
		Entry("unknown session", func(*locksv1alpha1.LockSession) (user, []string) {
			return lockUser(context.Background()), []string{"force-release", "--session", "nope"}
		}, icli.ExitNotFound, "session "),
		Entry("a KEY and --session", func(s *locksv1alpha1.LockSession) (user, []string) {
			return lockUser(context.Background()), []string{"force-release", "jobs", "--session", s.Name}
		}, icli.ExitUsage, "no KEY with --session"),
		Entry("--reason with --session", func(s *locksv1alpha1.LockSession) (user, []string) {
			return lockUser(context.Background()), []string{"force-release", "--session", s.Name, "--reason", "x"}
		}, icli.ExitUsage, "--reason goes with a KEY"),
		Entry("not a session name", func(*locksv1alpha1.LockSession) (user, []string) {
			return lockUser(context.Background()), []string{"force-release", "--session", "Not_A_Name"}
		}, icli.ExitUsage, "is not a session name"),
	)
})
