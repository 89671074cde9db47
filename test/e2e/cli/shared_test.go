package cli

import (
	"context"
	"encoding/json"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/gbytes"
	"github.com/onsi/gomega/gexec"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	icli "github.com/kubelock/kubelock/internal/cli"
	"github.com/kubelock/kubelock/test/suite"
)

// admin is a user with every right (system:masters), as a cluster administrator.
func admin() user { return user{name: "admin", kubeconfig: writeKubeconfig("admin", env.Config)} }

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

func int32p(v int32) *int32 { return &v }
