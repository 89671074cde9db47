package cli

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/gbytes"
	"github.com/onsi/gomega/gexec"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	icli "github.com/kubelock/kubelock/cmd/kubelock/cli"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/suite"
	"github.com/kubelock/kubelock/test/testenv"
)

type leaseJSON struct {
	Name         string `json:"name"`
	FencingToken int64  `json:"fencingToken"`
	LeaseID      string `json:"leaseID"`
	// Slot is a shared holding's permit.
	Slot *int32 `json:"slot"`
}

func parseLease(s *gexec.Session) leaseJSON {
	var v leaseJSON
	ExpectWithOffset(1, json.Unmarshal(s.Out.Contents(), &v)).To(Succeed(), "%s", s.Out.Contents())
	return v
}

var _ = Describe("kubelock commands", func() {
	ctx := context.Background()
	var ns string
	suite.NamespaceEach(&ns)

	It("acquires, shows the waiting line, hands over in queue order, describes and releases", func() {
		suite.NewLock(ctx, ns, "jobs", locksv1alpha1.DistributedLockSpec{LeaseDurationSeconds: 60})
		dumpLockOnFailure(ctx, ns, "jobs")
		alice, bob := lockUser(ctx), lockUser(ctx)

		a := kl(alice, ns, "acquire", "jobs", "-o", "json")
		Expect(a).To(gexec.Exit(0))
		la := parseLease(a)
		l := suite.GetLock(ctx, ns, "jobs")
		Expect(l.Status.Holder.LeaseID).To(Equal(la.LeaseID))
		Expect(l.Status.FencingToken).To(Equal(la.FencingToken))

		busy := kl(bob, ns, "acquire", "jobs")
		Expect(busy).To(gexec.Exit(icli.ExitNotAcquired))
		Expect(stderrLines(busy)).To(ConsistOf(ContainSubstring("held by " + alice.name)))

		short := kl(bob, ns, "acquire", "jobs", "--wait", "1s")
		Expect(short).To(gexec.Exit(icli.ExitNotAcquired))
		Expect(stderrLines(short)).To(ConsistOf(ContainSubstring("timed out")))

		waiting := start(bob, ns, "acquire", "jobs", "--wait", "1m", "--progress", "always", "-o", "json")
		Eventually(waiting.Err).Should(gbytes.Say(`waiting for jobs: position 1 of 1, held by ` + alice.name))

		desc := kl(alice, ns, "describe", "jobs")
		Expect(desc).To(gexec.Exit(0))
		Expect(desc.Out).To(gbytes.Say(`Identity:\s+` + alice.name))
		Expect(desc.Out).To(gbytes.Say(`Queue:\n\s+POSITION.*\n\s+1\s+` + bob.name))

		Expect(kl(alice, ns, "release", "jobs", "--lease-id", la.LeaseID)).To(gexec.Exit(0))
		Eventually(waiting).Should(gexec.Exit(0))
		lb := parseLease(waiting)
		Expect(lb.FencingToken).To(BeNumerically(">", la.FencingToken))

		again := kl(alice, ns, "release", "jobs", "--lease-id", la.LeaseID)
		Expect(again).To(gexec.Exit(0), "releasing twice is idempotent")

		desc = kl(bob, ns, "describe", "jobs")
		Expect(desc).To(gexec.Exit(0))
		Expect(desc.Out).To(gbytes.Say(`Recent acquisitions`))
		Expect(desc.Out).To(gbytes.Say(alice.name + `.*Released\s+` + alice.name))
		Expect(desc.Out).To(gbytes.Say(`Events:\s+<not shown: no permission to list events>`))

		tbl := kl(bob, ns, "get", "jobs")
		Expect(tbl).To(gexec.Exit(0))
		Expect(tbl.Out).To(gbytes.Say(`NAME\s+TYPE\s+HOLDERS\s+HOLDER\s+TOKEN\s+EXPIRES-IN\s+WAITERS\s+AGE\n`))
		Expect(tbl.Out).To(gbytes.Say(`jobs\s+Mutex\s+1\s+` + bob.name + `\s+` + itoa(lb.FencingToken) + `\s+\d+s\s+0\s+`))

		// Someone who may read events sees the controller's: by default only
		// what a person must see (--events=important), such as a force-release.
		Expect(kl(breakglass(ctx, ns), ns, "force-release", "jobs", "--reason", "e2e: events")).To(gexec.Exit(0))
		Eventually(func() string {
			return string(kl(admin(), ns, "describe", "jobs").Out.Contents())
		}).Should(MatchRegexp(`Events:\n\s+TYPE\s+REASON.*\n(.*\n)*\s+\w+\s+ForceReleased\s+`))
	})

	It("answers a retried acquire with the same request ID with the same lease", func() {
		suite.NewLock(ctx, ns, "jobs", locksv1alpha1.DistributedLockSpec{})
		u := lockUser(ctx)
		first := kl(u, ns, "acquire", "jobs", "--request-id", "deploy-42", "-o", "json")
		Expect(first).To(gexec.Exit(0))
		retry := kl(u, ns, "acquire", "jobs", "--request-id", "deploy-42", "-o", "json")
		Expect(retry).To(gexec.Exit(0))
		Expect(parseLease(retry)).To(Equal(parseLease(first)))
	})

	It("creates a lock for a business key on first use with --create", func() {
		u := lockUser(ctx)
		s := kl(u, ns, "acquire", "orders/42", "--create", "-o", "yaml")
		Expect(s).To(gexec.Exit(0))
		Expect(s.Out).To(gbytes.Say(`key: orders/42`))
		list := kl(u, ns, "list")
		Expect(list).To(gexec.Exit(0))
		Expect(list.Out).To(gbytes.Say(`NAME\s+KEY\s+TYPE\s+HOLDERS\s+HOLDER`))
		Expect(list.Out).To(gbytes.Say(`orders-42-[0-9a-f]{12}\s+orders/42\s+Mutex\s+1\s+` + u.name))
	})

	It("escapes control and format characters of a lock's key in get, list, describe and errors", func() {
		u := lockUser(ctx)
		// An escape sequence that would clear the screen and set the terminal's
		// title, and a right-to-left override; keys may hold any character.
		key := "orders\x1b[2J\x1b]0;owned\x07\u202e42"
		const shown = `orders\x1b[2J\x1b]0;owned\x07\u202e42`
		Expect(kl(u, ns, "acquire", key, "--create")).To(gexec.Exit(0))
		name, err := lock.NameForKey(key)
		Expect(err).NotTo(HaveOccurred())
		dumpLockOnFailure(ctx, ns, name)
		for _, args := range [][]string{{"get", key}, {"list"}, {"get"}, {"describe", key}} {
			s := kl(u, ns, args...)
			Expect(s).To(gexec.Exit(0), "%v: %s", args, s.Err.Contents())
			out := string(s.Out.Contents())
			Expect(out).To(ContainSubstring(shown), "%v", args)
			Expect(out).NotTo(ContainSubstring("\x1b"), "%v", args)
			Expect(out).NotTo(ContainSubstring("\u202e"), "%v", args)
		}
		// JSON keeps the key exact (the encoder escapes it).
		js := kl(u, ns, "get", key, "-o", "json")
		Expect(js).To(gexec.Exit(0))
		var obj locksv1alpha1.DistributedLock
		Expect(json.Unmarshal(js.Out.Contents(), &obj)).To(Succeed())
		Expect(obj.Annotations[locksv1alpha1.KeyAnnotation]).To(Equal(key))
		// An error that quotes the key.
		busy := kl(lockUser(ctx), ns, "acquire", key)
		Expect(busy).To(gexec.Exit(icli.ExitNotAcquired))
		Expect(string(busy.Err.Contents())).NotTo(ContainSubstring("\x1b"))
	})

	It("runs as a kubectl plugin found on PATH", func() {
		suite.NewLock(ctx, ns, "orders-db", locksv1alpha1.DistributedLockSpec{})
		u := lockUser(ctx)
		cmd := exec.Command(filepath.Join(testenv.AssetsDir(), "kubectl"), "lock", "list", "-n", ns)
		cmd.Env = append(os.Environ(), "PATH="+binDir+string(os.PathListSeparator)+os.Getenv("PATH"), "KUBECONFIG="+u.kubeconfig)
		s, err := gexec.Start(cmd, GinkgoWriter, GinkgoWriter)
		Expect(err).NotTo(HaveOccurred())
		Eventually(s).Should(gexec.Exit(0))
		Expect(s.Out).To(gbytes.Say(`NAME\s+TYPE\s+HOLDERS\s+HOLDER\s+TOKEN\s+EXPIRES-IN\s+WAITERS\s+AGE\n`))
		Expect(s.Out).To(gbytes.Say(`orders-db\s+Mutex\s+0\s+<free>\s+0\s+-\s+0\s+`))

		help := exec.Command(filepath.Join(testenv.AssetsDir(), "kubectl"), "lock", "--help")
		help.Env = cmd.Env
		out, err := help.Output()
		Expect(err).NotTo(HaveOccurred())
		Expect(string(out)).To(ContainSubstring("kubectl lock [command]"))
		Expect(string(out)).NotTo(ContainSubstring("kubelock [command]"))
	})

	DescribeTable("bad input: one line on stderr and a distinct exit code",
		func(setup func(ns string) (user, []string), code int, msg string) {
			suite.NewLock(ctx, ns, "jobs", locksv1alpha1.DistributedLockSpec{})
			u, args := setup(ns)
			s := kl(u, ns, args...)
			Expect(s).To(gexec.Exit(code), "stderr: %s", s.Err.Contents())
			Expect(stderrLines(s)).To(ConsistOf(And(HavePrefix("kubelock: "), ContainSubstring(msg))))
			Expect(string(s.Err.Contents())).NotTo(ContainSubstring("goroutine"))
			Expect(s.Out.Contents()).To(BeEmpty())
		},
		Entry("unknown lock (get)", func(string) (user, []string) {
			return lockUser(context.Background()), []string{"get", "nope"}
		}, icli.ExitNotFound, "lock not found"),
		Entry("unknown lock (run)", func(string) (user, []string) {
			return lockUser(context.Background()), []string{"run", "nope", "--", "true"}
		}, icli.ExitNotFound, "lock not found"),
		Entry("unknown lease", func(string) (user, []string) {
			return lockUser(context.Background()), []string{"release", "jobs", "--lease-id", "0123456789abcdef0123456789abcdef"}
		}, icli.ExitLockLost, "does not hold"),
		Entry("invalid key", func(string) (user, []string) {
			return lockUser(context.Background()), []string{"acquire", strings.Repeat("k", 1100)}
		}, icli.ExitUsage, "limit is 1024"),
		Entry("no permission to read locks", func(string) (user, []string) {
			return nobody(), []string{"get", "jobs"}
		}, icli.ExitDenied, "forbidden"),
		Entry("no permission to force-release", func(ns string) (user, []string) {
			u := lockUser(context.Background())
			ExpectWithOffset(1, kl(u, ns, "acquire", "jobs")).To(gexec.Exit(0))
			return u, []string{"force-release", "jobs", "--reason", "trying my luck"}
		}, icli.ExitDenied, "force-release"),
		Entry("lease above the lock's maximum (the CRD's rule, 422)", func(string) (user, []string) {
			return lockUser(context.Background()), []string{"acquire", "jobs", "--lease", "1h"}
		}, icli.ExitDenied, "must not exceed spec.maxLeaseDurationSeconds"),
		Entry("release of someone else's lease (admission, 403)", func(ns string) (user, []string) {
			holder := kl(lockUser(context.Background()), ns, "acquire", "jobs", "-o", "json")
			ExpectWithOffset(1, holder).To(gexec.Exit(0))
			return lockUser(context.Background()), []string{"release", "jobs", "--lease-id", parseLease(holder).LeaseID}
		}, icli.ExitDenied, "[kubelock:"),
		Entry("unreachable apiserver", func(string) (user, []string) {
			return user{name: "x", kubeconfig: unreachableKubeconfig()}, []string{"acquire", "jobs"}
		}, icli.ExitUnreachable, "connection refused"),
		Entry("--wait beyond the bound", func(string) (user, []string) {
			return lockUser(context.Background()), []string{"acquire", "jobs", "--wait", "3h"}
		}, icli.ExitUsage, "--wait 3h0m0s is outside"),
	)
})

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

var _ = Describe("config/samples", func() {
	It("are accepted by the apiserver (server-side dry run through kubectl)", func() {
		cmd := exec.Command(filepath.Join(testenv.AssetsDir(), "kubectl"), "--kubeconfig", admin().kubeconfig,
			"apply", "--dry-run=server", "-k", filepath.Join(testenv.RepoRoot(), "config", "samples"))
		s, err := gexec.Start(cmd, GinkgoWriter, GinkgoWriter)
		Expect(err).NotTo(HaveOccurred())
		Eventually(s).Should(gexec.Exit(0))
		out := string(s.Out.Contents())
		for _, obj := range []string{"distributedlock.locks.kubelock.io/orders-db", "distributedlock.locks.kubelock.io/indexers",
			"distributedlock.locks.kubelock.io/catalog", "job.batch/orders-db-migration", "job.batch/indexers", "deployment.apps/orders-writer",
			"deployment.apps/invoice-workers"} {
			Expect(out).To(ContainSubstring(obj+" created (server dry run)"), "%s", out)
		}
	})
})
