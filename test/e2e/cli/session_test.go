package cli

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/gbytes"
	"github.com/onsi/gomega/gexec"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/fencing/postgres"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/pgtest"
	"github.com/kubelock/kubelock/test/suite"
	"github.com/kubelock/kubelock/test/testenv"
)

var _ = Describe("sessions of run and sidecar", func() {
	ctx := context.Background()

	sessions := func(ns string) []locksv1alpha1.LockSession {
		list := &locksv1alpha1.LockSessionList{}
		Expect(env.Client.List(ctx, list, client.InNamespace(ns))).To(Succeed())
		return list.Items
	}

	It("run holds its lock in a session with the lease as TTL and closes it after the release; --session=false does not", func() {
		ns := suite.Namespace(ctx)
		suite.NewLock(ctx, ns, "jobs", locksv1alpha1.DistributedLockSpec{LeaseDurationSeconds: 7})
		dumpLockOnFailure(ctx, ns, "jobs")
		dir := GinkgoT().TempDir()
		gate := filepath.Join(dir, "gate")
		u := lockUser(ctx)
		r := start(u, ns, "run", "jobs", "--", "sh", "-c", fmt.Sprintf("while [ ! -e %s ]; do sleep 0.05; done", gate))
		Eventually(func() string {
			h := suite.GetLock(ctx, ns, "jobs").Status.Holder
			if h == nil {
				return ""
			}
			return h.Session
		}).ShouldNot(BeEmpty())
		h := suite.GetLock(ctx, ns, "jobs").Status.Holder
		Expect(h.LeaseDurationSeconds).To(BeEquivalentTo(7), "the session's TTL is the lock's lease")
		Expect(sessions(ns)).To(ConsistOf(HaveField("Name", h.Session)))
		Expect(exec.Command("touch", gate).Run()).To(Succeed())
		Eventually(r).Should(gexec.Exit(0))
		Expect(suite.GetLock(ctx, ns, "jobs").Status.RecentAcquisitions).To(ContainElement(SatisfyAll(
			HaveField("LeaseID", h.LeaseID), HaveField("EndReason", locksv1alpha1.EndReasonReleased))))
		Eventually(func() []locksv1alpha1.LockSession { return sessions(ns) }).Should(BeEmpty())

		r = kl(u, ns, "run", "jobs", "--session=false", "--", "sh", "-c", "test -n \"$KUBELOCK_FENCING_TOKEN\"")
		Expect(r).To(gexec.Exit(0))
		last := suite.GetLock(ctx, ns, "jobs").Status.RecentAcquisitions
		Expect(last[len(last)-1].EndReason).To(Equal(locksv1alpha1.EndReasonReleased))
		Expect(sessions(ns)).To(BeEmpty())
	})

	It("sidecar holds its lock in a session, stays ready while it lives and closes it after releasing on SIGTERM", func() {
		ns := suite.Namespace(ctx)
		suite.NewLock(ctx, ns, "leader", locksv1alpha1.DistributedLockSpec{LeaseDurationSeconds: 5})
		dumpLockOnFailure(ctx, ns, "leader")
		tokenFile := filepath.Join(GinkgoT().TempDir(), "token")
		sc := start(lockUser(ctx), ns, "sidecar", "leader", "--listen", "127.0.0.1:0", "--token-file", tokenFile)
		Eventually(sc.Err).Should(gbytes.Say(`holding \S+ with token \d+`))
		h := suite.GetLock(ctx, ns, "leader").Status.Holder
		Expect(h.Session).NotTo(BeEmpty())
		// Past two TTLs the holding is still the same: the session renews it.
		Consistently(func() string { return suite.GetLock(ctx, ns, "leader").Status.Holder.LeaseID }, 11*time.Second, time.Second).Should(Equal(h.LeaseID))
		Expect(sc.Signal(syscall.SIGTERM)).NotTo(BeNil())
		Eventually(sc).Should(gexec.Exit(0))
		Expect(suite.GetLock(ctx, ns, "leader").Status.Holder).To(BeNil())
		Expect(sessions(ns)).To(BeEmpty())
	})
})

// Needs the sessions controller: it ends a lapsed session's holdings
// (SessionExpired) before anyone else may take them.
var _ = Describe("a session client SIGSTOPped past its TTL", Serial, func() {
	It("loses every lock before another client takes any of them, and PostgreSQL refuses its late fenced writes", func(ctx SpecContext) {
		pg, err := pgtest.Start(ctx)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(pg.Stop)
		dsn, err := pg.CreateDatabase(ctx, "sessions")
		Expect(err).NotTo(HaveOccurred())
		db, err := pgxpool.New(ctx, dsn)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(db.Close)
		guard := postgres.NewGuard(db)
		Expect(guard.Migrate(ctx)).To(Succeed())
		_, err = db.Exec(ctx, "CREATE TABLE writes (key text, token bigint)")
		Expect(err).NotTo(HaveOccurred())

		holderBin := filepath.Join(binDir, "sessionholder")
		build := exec.Command("go", "build", "-o", holderBin, "./test/e2e/cli/sessionholder")
		build.Dir = testenv.RepoRoot()
		out, err := build.CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), "%s", out)

		ns := suite.Namespace(ctx)
		keys := []string{"orders", "invoices", "stock"}
		for _, k := range keys {
			suite.NewLock(ctx, ns, k, locksv1alpha1.DistributedLockSpec{})
		}
		const ttl = 5 * time.Second
		cmd := exec.Command(holderBin, append([]string{"-kubeconfig", lockUser(ctx).kubeconfig, "-namespace", ns, "-ttl", ttl.String(), "-pg", dsn}, keys...)...)
		stdin, err := cmd.StdinPipe()
		Expect(err).NotTo(HaveOccurred())
		holder, err := gexec.Start(cmd, GinkgoWriter, GinkgoWriter)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { holder.Kill().Wait() })
		Eventually(holder.Out).Should(gbytes.Say("ready"))
		old := map[string]int64{}
		for _, m := range regexp.MustCompile(`held (\S+) (\d+)`).FindAllStringSubmatch(string(holder.Out.Contents()), -1) {
			old[m[1]], _ = strconv.ParseInt(m[2], 10, 64)
		}
		Expect(old).To(HaveLen(len(keys)))
		_, _ = fmt.Fprintln(stdin, "write")
		for range keys {
			Eventually(holder.Out).Should(gbytes.Say(`write \S+ \d+ ok`))
		}
		// The deadline the holder is stopped past comes from a renewal, not the create.
		Eventually(func() []locksv1alpha1.LockSession {
			list := &locksv1alpha1.LockSessionList{}
			Expect(env.Client.List(ctx, list, client.InNamespace(ns))).To(Succeed())
			return list.Items
		}).WithTimeout(2*ttl).
			Should(ConsistOf(HaveField("Status.RenewTime", Not(BeNil()))), "the holder's session is renewed before it is stopped")

		By("stopping the holder past its TTL while another client waits for its locks")
		Expect(holder.Command.Process.Signal(syscall.SIGSTOP)).To(Succeed())
		stoppedAt := time.Now()
		other, _ := suite.NewClient(ctx, ns)
		type grant struct {
			at time.Time
			l  *lock.Lock
		}
		granted := make(chan grant, len(keys))
		for _, k := range keys {
			go func() {
				defer GinkgoRecover()
				l, err := other.Acquire(ctx, k, lock.WithWaitTimeout(time.Minute))
				Expect(err).NotTo(HaveOccurred())
				granted <- grant{time.Now(), l}
			}()
		}
		grants := map[string]grant{}
		for range keys {
			var g grant
			Eventually(granted, 6*ttl).Should(Receive(&g))
			grants[g.l.Key()] = g
			Expect(g.l.FencingToken()).To(BeNumerically(">", old[g.l.Key()]))
			last := suite.GetLock(ctx, ns, g.l.Name()).Status.RecentAcquisitions
			ended := last[len(last)-1]
			Expect(ended.FencingToken).To(Equal(old[g.l.Key()]))
			Expect(ended.EndReason).To(Equal(locksv1alpha1.EndReasonSessionExpired))
			Expect(g.at.Sub(stoppedAt)).To(BeNumerically(">", ttl/2), "the controller waited for the session to lapse")
			Expect(guard.Do(ctx, g.l.Key(), g.l.FencingToken(), func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, "INSERT INTO writes (key, token) VALUES ($1, $2)", g.l.Key(), g.l.FencingToken())
				return err
			})).To(Succeed())
		}

		By("resuming the holder: every lock ended before any was taken again, and its late writes are refused")
		Expect(holder.Command.Process.Signal(syscall.SIGCONT)).To(Succeed())
		_, _ = fmt.Fprintln(stdin, "status")
		statusRE := regexp.MustCompile(`status (\S+) done=(\w+) expires=(\d+)`)
		Eventually(func() int { return len(statusRE.FindAllString(string(holder.Out.Contents()), -1)) }, 10*time.Second).Should(Equal(len(keys)))
		for _, m := range statusRE.FindAllStringSubmatch(string(holder.Out.Contents()), -1) {
			Expect(m[2]).To(Equal("true"), "%s's context ended", m[1])
			expires, _ := strconv.ParseInt(m[3], 10, 64)
			deadline := time.Unix(0, expires)
			Expect(deadline.Before(grants[m[1]].at)).To(BeTrue(),
				"%s: the holder's safe deadline %s passed before the other client took it at %s (I5)", m[1], deadline, grants[m[1]].at)
			fmt.Fprintf(GinkgoWriter, "%s: holder's safe deadline %s, taken again %s later\n", m[1], deadline.Format(time.StampMicro), grants[m[1]].at.Sub(deadline))
		}
		_, _ = fmt.Fprintln(stdin, "write")
		for range keys {
			Eventually(holder.Out).Should(gbytes.Say(`write \S+ \d+ refused: .*stale`))
		}
		for k, token := range old {
			var n int
			Expect(db.QueryRow(ctx, "SELECT count(*) FROM writes WHERE key = $1 AND token = $2", k, token).Scan(&n)).To(Succeed())
			Expect(n).To(Equal(1), "%s: only the write made while the lock was held landed, not the late one", k)
		}
		for _, g := range grants {
			Expect(g.l.Release(ctx)).To(Succeed())
		}
		Expect(stdin.Close()).To(Succeed())
		Eventually(holder).Should(gexec.Exit())
	})
})
