package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/gbytes"
	"github.com/onsi/gomega/gexec"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	icli "github.com/kubelock/kubelock/cmd/kubelock/cli"
	"github.com/kubelock/kubelock/test/suite"
)

var _ = Describe("kubelock create", func() {
	ctx := context.Background()
	var ns string
	suite.NamespaceEach(&ns)

	DescribeTable("creates each type as an administrator, shown by get",
		func(args []string, want locksv1alpha1.LockType, permits *int32, row string) {
			s := kl(admin(), ns, append([]string{"create", "pool"}, args...)...)
			Expect(s).To(gexec.Exit(0), "stderr: %s", s.Err.Contents())
			Expect(s.Out).To(gbytes.Say(`created ` + ns + `/pool: ` + string(want)))
			l := suite.GetLock(ctx, ns, "pool")
			Expect(l.LockType()).To(Equal(want))
			Expect(l.Spec.Permits).To(Equal(permits))
			Expect(l.Annotations).To(HaveKeyWithValue(locksv1alpha1.KeyAnnotation, "pool"))

			get := kl(lockUser(ctx), ns, "get", "pool")
			Expect(get).To(gexec.Exit(0))
			Expect(get.Out).To(gbytes.Say(`NAME\s+TYPE\s+HOLDERS\s+HOLDER\s+TOKEN\s+EXPIRES-IN\s+WAITERS\s+AGE\n`))
			Expect(get.Out).To(gbytes.Say(row))
		},
		Entry("Mutex (the default)", nil, locksv1alpha1.Mutex, nil, `pool\s+Mutex\s+0\s+<free>\s+0\s+-\s+0\s+`),
		Entry("RWMutex", []string{"--type", "RWMutex", "--lease", "1m"}, locksv1alpha1.RWMutex, nil, `pool\s+RWMutex\s+0\s+<free>\s+0\s+-\s+0\s+`),
		Entry("Semaphore", []string{"--type", "semaphore", "--permits", "3"}, locksv1alpha1.Semaphore, int32p(3), `pool\s+Semaphore\s+0/3\s+<free>\s+0\s+-\s+0\s+`),
	)

	It("prints the stored object with -o json, and a business key's lock under its derived name", func() {
		s := kl(admin(), ns, "create", "orders/42", "--type", "Semaphore", "--permits", "2", "--max-lease", "10m", "-o", "json")
		Expect(s).To(gexec.Exit(0), "stderr: %s", s.Err.Contents())
		var obj locksv1alpha1.DistributedLock
		Expect(json.Unmarshal(s.Out.Contents(), &obj)).To(Succeed())
		Expect(obj.Name).To(MatchRegexp(`^orders-42-[0-9a-f]{12}$`))
		Expect(obj.Spec.MaxLeaseDurationSeconds).To(BeEquivalentTo(600))
		Expect(obj.Spec.LeaseDurationSeconds).To(BeEquivalentTo(locksv1alpha1.DefaultLeaseDurationSeconds), "the CRD's defaults are filled in")
		Expect(obj.Annotations).To(HaveKeyWithValue(locksv1alpha1.KeyAnnotation, "orders/42"))
	})

	It("refuses a lock user's spec with the admission denial, and an existing lock", func() {
		u := lockUser(ctx)
		s := kl(u, ns, "create", "pool", "--type", "Semaphore", "--permits", "3")
		Expect(s).To(gexec.Exit(icli.ExitDenied))
		GinkgoWriter.Printf("$ kubectl lock create pool --type Semaphore --permits 3 (as a lock user)\n%s", s.Err.Contents())
		Expect(stderrLines(s)).To(ConsistOf(And(HavePrefix("kubelock: creating lock "+ns+"/pool: "),
			ContainSubstring("[kubelock:create]"), ContainSubstring(`user "`+u.name+`" may create a lock only with the default spec`))))
		Expect(s.Out.Contents()).To(BeEmpty())

		Expect(kl(admin(), ns, "create", "pool", "--type", "RWMutex")).To(gexec.Exit(0))
		again := kl(admin(), ns, "create", "pool", "--type", "Semaphore", "--permits", "3")
		Expect(again).To(gexec.Exit(icli.ExitError))
		Expect(stderrLines(again)).To(ConsistOf(ContainSubstring("lock " + ns + "/pool already exists")))
		Expect(suite.GetLock(ctx, ns, "pool").LockType()).To(Equal(locksv1alpha1.RWMutex), "the refused create changed nothing")
	})

	DescribeTable("bad flags: a usage error before anything is sent",
		func(args []string, msg string) {
			s := kl(admin(), ns, append([]string{"create", "pool"}, args...)...)
			Expect(s).To(gexec.Exit(icli.ExitUsage))
			Expect(stderrLines(s)).To(ConsistOf(And(HavePrefix("kubelock: "), ContainSubstring(msg))))
		},
		Entry("unknown type", []string{"--type", "Barrier"}, `--type must be Mutex, RWMutex or Semaphore, got "Barrier"`),
		Entry("Semaphore without permits", []string{"--type", "Semaphore"}, "--type Semaphore needs --permits N"),
		Entry("permits on a Mutex", []string{"--permits", "2"}, "--permits goes with --type Semaphore"),
		Entry("permits out of range", []string{"--type", "Semaphore", "--permits", "0"}, "--permits must be within 1..1024"),
		Entry("lease above the maximum", []string{"--lease", "10m"}, "raise --max-lease"),
		Entry("lease not whole seconds", []string{"--lease", "1500ms"}, "--lease must be whole seconds"),
	)
})

var _ = Describe("shared modes in the CLI", func() {
	ctx := context.Background()
	var ns string
	suite.NamespaceEach(&ns)

	It("describes a Semaphore with three holders, each on its own slot with its own token, and its queue", func() {
		Expect(kl(admin(), ns, "create", "indexers", "--type", "Semaphore", "--permits", "3", "--max-lease", "10m")).To(gexec.Exit(0))
		dumpLockOnFailure(ctx, ns, "indexers")
		var users []user
		var leases []leaseJSON
		for range 3 {
			u := lockUser(ctx)
			s := kl(u, ns, "acquire", "indexers", "--lease", "5m", "-o", "json")
			Expect(s).To(gexec.Exit(0), "stderr: %s", s.Err.Contents())
			users, leases = append(users, u), append(leases, parseLease(s))
		}
		for i, l := range leases {
			Expect(l.Slot).To(HaveValue(BeEquivalentTo(i)), "the lowest free slot")
			if i > 0 {
				Expect(l.FencingToken).To(BeNumerically(">", leases[i-1].FencingToken))
			}
		}
		full := kl(lockUser(ctx), ns, "acquire", "indexers")
		Expect(full).To(gexec.Exit(icli.ExitNotAcquired), "stderr: %s", full.Err.Contents())
		late := lockUser(ctx)
		waiting := start(late, ns, "acquire", "indexers", "--wait", "1m", "--progress", "always", "-o", "json")
		Eventually(waiting.Err).Should(gbytes.Say(`waiting for indexers: position 1 of 1, held shared by 3`))

		desc := kl(users[0], ns, "describe", "indexers")
		Expect(desc).To(gexec.Exit(0), "stderr: %s", desc.Err.Contents())
		out := string(desc.Out.Contents())
		GinkgoWriter.Printf("$ kubectl lock describe indexers\n%s", out)
		AddReportEntry("kubectl lock describe of a Semaphore with three holders", out)
		Expect(out).To(MatchRegexp(`Type:\s+Semaphore \(3 permits\)`))
		Expect(out).To(MatchRegexp(`Holders \(3 of 3 permits\):\n\s+SLOT\s+TOKEN\s+IDENTITY\s+USER\s+SESSION\s+ACQUIRED\s+RENEWED\s+EXPIRES\s+LEASE-ID\n`))
		for i, l := range leases {
			Expect(out).To(MatchRegexp(`\n\s+%d\s+%d\s+%s\s+%[3]s\s+-\s+\S+ ago\s+\S+ ago\s+\S+\s+%s\n`, i, l.FencingToken, users[i].name, l.LeaseID))
		}
		Expect(out).To(MatchRegexp(`Queue:\n\s+POSITION\s+MODE\s+IDENTITY.*\n\s+1\s+Shared\s+%s\s`, late.name))
		Expect(out).NotTo(ContainSubstring("Holder:"), "a Semaphore has no exclusive holder")

		get := kl(users[0], ns, "get", "indexers")
		Expect(get).To(gexec.Exit(0))
		GinkgoWriter.Printf("$ kubectl lock get indexers\n%s", get.Out.Contents())
		Expect(get.Out).To(gbytes.Say(`indexers\s+Semaphore\s+3/3\s+%s,%s \+ 1 more\s+%d\s+\S+\s+1\s+`, users[0].name, users[1].name, leases[2].FencingToken))

		// The permit of slot 1 is released; the waiter takes that slot with a new token.
		Expect(kl(users[1], ns, "release", "indexers", "--lease-id", leases[1].LeaseID)).To(gexec.Exit(0))
		Eventually(waiting).Should(gexec.Exit(0))
		next := parseLease(waiting)
		Expect(next.Slot).To(HaveValue(BeEquivalentTo(1)))
		Expect(next.FencingToken).To(BeNumerically(">", leases[2].FencingToken))
		desc = kl(late, ns, "describe", "indexers")
		Expect(desc).To(gexec.Exit(0))
		Expect(desc.Out).To(gbytes.Say(`Recent acquisitions \(oldest first\):\n\s+TOKEN\s+SLOT\s+IDENTITY.*\n\s+%d\s+1\s+%s\s+.*Released`, leases[1].FencingToken, users[1].name))
	})

	It("lets two readers hold an RWMutex with acquire --shared, shuts the writer out, and refuses --shared on a Mutex", func() {
		Expect(kl(admin(), ns, "create", "catalog", "--type", "RWMutex")).To(gexec.Exit(0))
		dumpLockOnFailure(ctx, ns, "catalog")
		alice, bob := lockUser(ctx), lockUser(ctx)
		a := kl(alice, ns, "acquire", "catalog", "--shared", "-o", "json")
		Expect(a).To(gexec.Exit(0), "stderr: %s", a.Err.Contents())
		b := kl(bob, ns, "acquire", "catalog", "--shared", "-o", "json")
		Expect(b).To(gexec.Exit(0), "readers never block readers; stderr: %s", b.Err.Contents())
		la, lb := parseLease(a), parseLease(b)
		Expect(la.Slot).To(HaveValue(BeEquivalentTo(0)))
		Expect(lb.Slot).To(HaveValue(BeEquivalentTo(1)))
		Expect(lb.FencingToken).To(BeNumerically(">", la.FencingToken))

		l := suite.GetLock(ctx, ns, "catalog")
		Expect(l.Status.Holder).To(BeNil())
		Expect(l.Status.SharedHolders).To(HaveLen(2))

		tbl := kl(alice, ns, "acquire", "catalog", "--shared")
		Expect(tbl).To(gexec.Exit(0))
		Expect(tbl.Out).To(gbytes.Say(`NAME\s+TOKEN\s+SLOT\s+LEASE-ID\s+EXPIRES-AT\s+EXPIRES-IN\n`))
		Expect(tbl.Out).To(gbytes.Say(`catalog\s+\d+\s+2\s+[0-9a-f]{32}\s`))

		writer := kl(lockUser(ctx), ns, "acquire", "catalog")
		Expect(writer).To(gexec.Exit(icli.ExitNotAcquired), "stderr: %s", writer.Err.Contents())

		desc := kl(alice, ns, "describe", "catalog")
		Expect(desc).To(gexec.Exit(0))
		Expect(desc.Out).To(gbytes.Say(`Writer:\s+<none>\nReaders:\n\s+SLOT.*\n\s+0\s+%d\s+%s\s.*\n\s+1\s+%d\s+%s\s`, la.FencingToken, alice.name, lb.FencingToken, bob.name))

		suite.NewLock(ctx, ns, "jobs", locksv1alpha1.DistributedLockSpec{})
		mutex := kl(alice, ns, "acquire", "jobs", "--shared")
		Expect(mutex).To(gexec.Exit(icli.ExitUsage))
		Expect(stderrLines(mutex)).To(ConsistOf(And(HavePrefix("kubelock: "), ContainSubstring("Mutex"))))
		Expect(suite.GetLock(ctx, ns, "jobs").IsHeld()).To(BeFalse())
	})

	It("runs a command with --lock A --lock B held, tells it both holdings, and releases both", func() {
		Expect(kl(admin(), ns, "create", "orders-db")).To(gexec.Exit(0))
		Expect(kl(admin(), ns, "create", "indexers", "--type", "Semaphore", "--permits", "2")).To(gexec.Exit(0))
		dumpLockOnFailure(ctx, ns, "orders-db")
		dumpLockOnFailure(ctx, ns, "indexers")
		dir := GinkgoT().TempDir()
		envFile, goFile := filepath.Join(dir, "env"), filepath.Join(dir, "go")
		u := lockUser(ctx)
		// The command records its environment, then works until the test says go.
		run := start(u, ns, "run", "--lock", "orders-db", "--lock", "indexers", "--", "sh", "-c",
			fmt.Sprintf(`env | grep ^KUBELOCK_ | sort > %[1]s.tmp; mv %[1]s.tmp %[1]s; while [ ! -e %[2]s ]; do sleep 0.05; done`, envFile, goFile))
		Eventually(envFile).Should(BeAnExistingFile())
		b, err := os.ReadFile(envFile)
		Expect(err).NotTo(HaveOccurred())
		vars := map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			k, v, _ := strings.Cut(line, "=")
			vars[k] = v
		}
		GinkgoWriter.Printf("the command's environment:\n%s", b)

		// While the command runs, both locks are held by it, as its environment says.
		orders, indexers := suite.GetLock(ctx, ns, "orders-db"), suite.GetLock(ctx, ns, "indexers")
		Expect(orders.Status.Holder).NotTo(BeNil())
		Expect(indexers.Status.SharedHolders).To(HaveLen(1))
		permit := indexers.Status.SharedHolders[0]
		Expect(vars).To(Equal(map[string]string{
			"KUBELOCK_LOCK_COUNT":      "2",
			"KUBELOCK_LOCK_1":          ns + "/orders-db",
			"KUBELOCK_KEY_1":           "orders-db",
			"KUBELOCK_FENCING_TOKEN_1": itoa(orders.Status.FencingToken),
			"KUBELOCK_LEASE_ID_1":      orders.Status.Holder.LeaseID,
			"KUBELOCK_LOCK_2":          ns + "/indexers",
			"KUBELOCK_KEY_2":           "indexers",
			"KUBELOCK_FENCING_TOKEN_2": itoa(permit.FencingToken),
			"KUBELOCK_LEASE_ID_2":      permit.LeaseID,
			"KUBELOCK_SLOT_2":          "0",
		}))
		Expect(orders.Status.Holder.Session).NotTo(BeEmpty(), "held in run's session")
		Expect(permit.Session).To(Equal(orders.Status.Holder.Session), "one session for both")

		Expect(os.WriteFile(goFile, nil, 0o644)).To(Succeed())
		Eventually(run).Should(gexec.Exit(0))
		for _, name := range []string{"orders-db", "indexers"} {
			l := suite.GetLock(ctx, ns, name)
			Expect(l.IsHeld()).To(BeFalse(), "%s is released", name)
			last := l.Status.RecentAcquisitions[len(l.Status.RecentAcquisitions)-1]
			Expect(last.EndReason).To(Equal(locksv1alpha1.EndReasonReleased), name)
		}
	})

	It("takes all the locks or none: the command does not run while one is held elsewhere, and what was taken is released", func() {
		Expect(kl(admin(), ns, "create", "a")).To(gexec.Exit(0))
		Expect(kl(admin(), ns, "create", "b")).To(gexec.Exit(0))
		dumpLockOnFailure(ctx, ns, "a")
		// "a" comes first in the canonical order, so run takes it before it waits for "b".
		holder := kl(lockUser(ctx), ns, "acquire", "b", "--lease", "60s")
		Expect(holder).To(gexec.Exit(0))
		marker := filepath.Join(GinkgoT().TempDir(), "ran")
		s := kl(lockUser(ctx), ns, "run", "--lock", "b", "--lock", "a", "--wait", "2s", "--", "touch", marker)
		Expect(s).To(gexec.Exit(icli.ExitNotAcquired), "stderr: %s", s.Err.Contents())
		Expect(string(s.Err.Contents())).To(ContainSubstring(`"b"`))
		Expect(marker).NotTo(BeAnExistingFile())
		a := suite.GetLock(ctx, ns, "a")
		Expect(a.IsHeld()).To(BeFalse(), "the lock taken first was released")
		Expect(a.Status.RecentAcquisitions).To(HaveLen(1))
		Expect(a.Status.RecentAcquisitions[0].EndReason).To(Equal(locksv1alpha1.EndReasonReleased))
	})

	It("stops the command when one of its locks is lost and releases the other", func() {
		Expect(kl(admin(), ns, "create", "a")).To(gexec.Exit(0))
		Expect(kl(admin(), ns, "create", "b", "--type", "RWMutex")).To(gexec.Exit(0))
		dumpLockOnFailure(ctx, ns, "b")
		dir := GinkgoT().TempDir()
		run := start(lockUser(ctx), ns, "run", "--lock", "a", "--lock", "b", "--grace", "5s", "--", "sh", "-c",
			fmt.Sprintf(`trap 'echo term > %[1]s/term; exit 143' TERM; touch %[1]s/up; while :; do sleep 0.05; done`, dir))
		Eventually(filepath.Join).WithArguments(dir, "up").Should(BeAnExistingFile())
		Expect(kl(breakglass(ctx, ns), ns, "force-release", "b", "--reason", "e2e: one of two")).To(gexec.Exit(0))
		Eventually(run).Should(gexec.Exit(icli.ExitLockLost))
		Expect(filepath.Join(dir, "term")).To(BeAnExistingFile())
		a := suite.GetLock(ctx, ns, "a")
		Expect(a.IsHeld()).To(BeFalse())
		Expect(a.Status.RecentAcquisitions[len(a.Status.RecentAcquisitions)-1].EndReason).To(Equal(locksv1alpha1.EndReasonReleased))
	})

	It("runs a reader of an RWMutex with run --shared and gives it its slot", func() {
		Expect(kl(admin(), ns, "create", "catalog", "--type", "RWMutex")).To(gexec.Exit(0))
		reader := kl(lockUser(ctx), ns, "acquire", "catalog", "--shared")
		Expect(reader).To(gexec.Exit(0))
		envFile := filepath.Join(GinkgoT().TempDir(), "env")
		s := kl(lockUser(ctx), ns, "run", "catalog", "--shared", "--wait", "5s", "--", "sh", "-c",
			fmt.Sprintf(`echo "$KUBELOCK_SLOT $KUBELOCK_FENCING_TOKEN" > %s`, envFile))
		Expect(s).To(gexec.Exit(0), "stderr: %s", s.Err.Contents())
		b, err := os.ReadFile(envFile)
		Expect(err).NotTo(HaveOccurred())
		l := suite.GetLock(ctx, ns, "catalog")
		last := l.Status.RecentAcquisitions[len(l.Status.RecentAcquisitions)-1]
		Expect(last.Slot).To(HaveValue(BeEquivalentTo(1)))
		Expect(strings.TrimSpace(string(b))).To(Equal("1 " + itoa(last.FencingToken)))
		Expect(l.Status.SharedHolders).To(HaveLen(1), "the first reader still holds it")
	})

	It("holds a Semaphore's permit in the sidecar and shows its slot", func() {
		Expect(kl(admin(), ns, "create", "indexers", "--type", "Semaphore", "--permits", "2")).To(gexec.Exit(0))
		tokenFile := filepath.Join(GinkgoT().TempDir(), "token")
		sc := start(lockUser(ctx), ns, "sidecar", "indexers", "--listen", "127.0.0.1:0", "--token-file", tokenFile)
		Eventually(sc.Err).Should(gbytes.Say(`holding ` + ns + `/indexers shared on slot 0 with token (\d+)`))
		l := suite.GetLock(ctx, ns, "indexers")
		Expect(l.Status.SharedHolders).To(HaveLen(1))
		b, err := os.ReadFile(tokenFile)
		Expect(err).NotTo(HaveOccurred())
		Expect(strings.TrimSpace(string(b))).To(Equal(itoa(l.Status.SharedHolders[0].FencingToken)))
		sc.Signal(syscall.SIGTERM)
		Eventually(sc).Should(gexec.Exit(0))
		Expect(suite.GetLock(ctx, ns, "indexers").IsHeld()).To(BeFalse())
	})
})

func int32p(v int32) *int32 { return &v }
