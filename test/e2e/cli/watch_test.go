package cli

import (
	"net/http"
	"strconv"
	"sync/atomic"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/gbytes"
	"github.com/onsi/gomega/gexec"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/test/faultproxy"
	"github.com/kubelock/kubelock/test/suite"
)

var _ = Describe("kubectl lock get -w and list -w", func() {
	var ns string
	var alice user

	BeforeEach(func(ctx SpecContext) {
		ns = suite.Namespace(ctx)
		suite.NewLock(ctx, ns, "orders-db", locksv1alpha1.DistributedLockSpec{})
		alice = lockUser(ctx)
		dumpLockOnFailure(ctx, ns, "orders-db")
	})

	It("prints the table, then one line per change, and exits cleanly on Ctrl-C", func(ctx SpecContext) {
		w := start(alice, ns, "get", "orders-db", "-w")
		Eventually(w.Out).Should(gbytes.Say(`NAME\s+TYPE\s+HOLDERS\s+HOLDER\s+TOKEN\s+EXPIRES-IN\s+WAITERS\s+AGE\n`))
		Eventually(w.Out).Should(gbytes.Say(`orders-db\s+Mutex\s+0\s+<free>\s+0\s+-\s+0\s+\S+\n`))

		bob, bobName := suite.NewClient(ctx, ns)
		held, err := bob.TryAcquire(ctx, "orders-db")
		Expect(err).NotTo(HaveOccurred())
		token := strconv.FormatInt(held.FencingToken(), 10)
		Eventually(w.Out).Should(gbytes.Say(`orders-db\s+Mutex\s+1\s+` + bobName + `\s+` + token + `\s+\S+\s+0\s+\S+\n`))
		Expect(held.Release(ctx)).To(Succeed())
		Eventually(w.Out).Should(gbytes.Say(`orders-db\s+Mutex\s+0\s+<free>\s+` + token + `\s+-\s+0\s+\S+\n`))

		w.Interrupt()
		Eventually(w).Should(gexec.Exit(0))
		Expect(string(w.Err.Contents())).To(BeEmpty())
	})

	It("lists with -w --output-watch-events what is added, modified and deleted in the namespace", func(ctx SpecContext) {
		w := start(alice, ns, "list", "-w", "--output-watch-events")
		Eventually(w.Out).Should(gbytes.Say(`EVENT\s+NAME\s+TYPE\s+HOLDERS\s+HOLDER\s+TOKEN\s+EXPIRES-IN\s+WAITERS\s+AGE\n`))
		Eventually(w.Out).Should(gbytes.Say(`ADDED\s+orders-db\s+Mutex\s+0\s+<free>\s+0\s+`))

		payments := suite.NewLock(ctx, ns, "payments", locksv1alpha1.DistributedLockSpec{})
		Eventually(w.Out).Should(gbytes.Say(`ADDED\s+payments\s+Mutex\s+0\s+<free>\s+0\s+`))
		bob, bobName := suite.NewClient(ctx, ns)
		held, err := bob.TryAcquire(ctx, "payments")
		Expect(err).NotTo(HaveOccurred())
		Eventually(w.Out).Should(gbytes.Say(`MODIFIED\s+payments\s+Mutex\s+1\s+` + bobName + `\s+`))
		Expect(held.Release(ctx)).To(Succeed())
		Eventually(w.Out).Should(gbytes.Say(`MODIFIED\s+payments\s+Mutex\s+0\s+<free>\s+`))
		Expect(suite.Env.Client.Delete(ctx, payments)).To(Succeed())
		Eventually(w.Out).Should(gbytes.Say(`DELETED\s+payments\s+`))

		w.Terminate()
		Eventually(w).Should(gexec.Exit(0))
	})

	It("prints JSON documents per change with -o json", func(ctx SpecContext) {
		w := start(alice, ns, "get", "orders-db", "-w", "-o", "json")
		Eventually(w.Out).Should(gbytes.Say(`"kind": "DistributedLock"`))
		bob, _ := suite.NewClient(ctx, ns)
		held, err := bob.TryAcquire(ctx, "orders-db")
		Expect(err).NotTo(HaveOccurred())
		Eventually(w.Out).Should(gbytes.Say(`"fencingToken": ` + strconv.FormatInt(held.FencingToken(), 10)))
		w.Interrupt()
		Eventually(w).Should(gexec.Exit(0))
	})

	It("fails as get does for a key that names no lock", func() {
		want := kl(alice, ns, "get", "no-such-lock").ExitCode()
		s := kl(alice, ns, "get", "no-such-lock", "-w")
		Expect(s.ExitCode()).To(Equal(want))
		Expect(want).NotTo(BeZero())
		Expect(s.Err).To(gbytes.Say("no-such-lock"))
	})

	It("keeps watching after the connection to the apiserver breaks", func(ctx SpecContext) {
		cfg, name := suite.UserConfig(ctx)
		proxy, err := faultproxy.New(cfg)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(proxy.Close)
		var watches atomic.Int64
		proxy.SetRule(func(r *http.Request) faultproxy.Action {
			if r.URL.Query().Get("watch") == "true" {
				watches.Add(1)
			}
			return faultproxy.Pass
		})
		w := start(user{name: name, kubeconfig: writeKubeconfig(name+"-proxied", proxy.Config())}, ns, "get", "orders-db", "-w")
		Eventually(w.Out).Should(gbytes.Say(`orders-db\s+Mutex\s+0\s+<free>\s+0\s+`))
		Eventually(watches.Load).Should(BeNumerically(">=", 1))

		proxy.CutConnections()
		Eventually(watches.Load).Should(BeNumerically(">=", 2), "the watch is opened again")
		bob, bobName := suite.NewClient(ctx, ns)
		held, err := bob.TryAcquire(ctx, "orders-db")
		Expect(err).NotTo(HaveOccurred())
		Eventually(w.Out).Should(gbytes.Say(`orders-db\s+Mutex\s+1\s+` + bobName + `\s+` + strconv.FormatInt(held.FencingToken(), 10)))
		Expect(w).NotTo(gexec.Exit())

		w.Interrupt()
		Eventually(w).Should(gexec.Exit(0))
	})
})
