package cli

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/gbytes"
	"github.com/onsi/gomega/gexec"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	icli "github.com/kubelock/kubelock/cmd/kubelock/cli"
	"github.com/kubelock/kubelock/test/suite"
)

var _ = Describe("kubelock run", func() {
	ctx := context.Background()
	var ns, dir string
	BeforeEach(func() {
		ns = suite.Namespace(ctx)
		dir = GinkgoT().TempDir()
	})

	It("never lets the commands of two run processes overlap, and hands them increasing tokens", func() {
		suite.NewLock(ctx, ns, "jobs", locksv1alpha1.DistributedLockSpec{LeaseDurationSeconds: 5})
		dumpLockOnFailure(ctx, ns, "jobs")
		stamps := filepath.Join(dir, "stamps")
		script := fmt.Sprintf(`echo "start $KUBELOCK_FENCING_TOKEN $(date +%%s%%N)" >> %[1]s; sleep 0.3; echo "end $KUBELOCK_FENCING_TOKEN $(date +%%s%%N)" >> %[1]s`, stamps)
		alice, bob := lockUser(ctx), lockUser(ctx)
		var runs []*gexec.Session
		for i := range 4 {
			u := alice
			if i%2 == 1 {
				u = bob
			}
			runs = append(runs, start(u, ns, "run", "jobs", "--wait", "1m", "--", "sh", "-c", script))
		}
		for _, s := range runs {
			Eventually(s).Should(gexec.Exit(0))
		}

		b, err := os.ReadFile(stamps)
		Expect(err).NotTo(HaveOccurred())
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		Expect(lines).To(HaveLen(2 * len(runs)))
		var lastToken, lastEnd int64
		for i := 0; i < len(lines); i += 2 {
			start, end := strings.Fields(lines[i]), strings.Fields(lines[i+1])
			Expect(start[0]).To(Equal("start"), "line %d: %q", i, lines[i])
			Expect(end[0]).To(Equal("end"), "line %d: %q", i+1, lines[i+1])
			Expect(end[1]).To(Equal(start[1]), "a command ended with another's token")
			token, startAt, endAt := atoi(start[1]), atoi(start[2]), atoi(end[2])
			Expect(token).To(BeNumerically(">", lastToken), "tokens must increase")
			Expect(startAt).To(BeNumerically(">=", lastEnd), "commands overlapped")
			Expect(endAt).To(BeNumerically(">=", startAt))
			lastToken, lastEnd = token, endAt
		}
		l := suite.GetLock(ctx, ns, "jobs")
		Expect(l.Status.Holder).To(BeNil(), "run releases on exit")
		Expect(l.Status.RecentAcquisitions).To(HaveLen(len(runs)))
		for _, f := range l.Status.RecentAcquisitions {
			Expect(f.EndReason).To(Equal(locksv1alpha1.EndReasonReleased))
		}
	})

	It("stops the command and its grandchildren with SIGTERM when the lock is force-released, and exits with the lock-lost code", func() {
		suite.NewLock(ctx, ns, "batch", locksv1alpha1.DistributedLockSpec{LeaseDurationSeconds: 3})
		dumpLockOnFailure(ctx, ns, "batch")
		script := filepath.Join(dir, "work.sh")
		Expect(os.WriteFile(script, []byte(`#!/bin/sh
d="$1"
trap 'echo term > "$d/child-term"; exit 143' TERM
sh -c 'trap "echo term > \"$0/grandchild-term\"; exit 143" TERM; sleep 1000 & echo $! > "$0/sleep.pid"; wait' "$d" &
echo "$KUBELOCK_FENCING_TOKEN" > "$d/started"
wait
`), 0o755)).To(Succeed())
		holder := lockUser(ctx)
		run := start(holder, ns, "run", "batch", "--grace", "5s", "--", script, dir)
		Eventually(filepath.Join).WithArguments(dir, "started").Should(BeAnExistingFile())
		Eventually(filepath.Join).WithArguments(dir, "sleep.pid").Should(BeAnExistingFile())
		sleepPID := readPID(filepath.Join(dir, "sleep.pid"))
		Expect(processGone(sleepPID)).To(BeFalse())
		leaseID := suite.GetLock(ctx, ns, "batch").Status.Holder.LeaseID

		br := kl(breakglass(ctx, ns), ns, "force-release", "batch", "--reason", "e2e: stuck batch")
		Expect(br).To(gexec.Exit(0))
		Expect(br.Out).To(gbytes.Say("force-released " + ns + "/batch: ended lease " + leaseID))

		Eventually(run).Should(gexec.Exit(icli.ExitLockLost))
		Expect(filepath.Join(dir, "child-term")).To(BeAnExistingFile(), "the command got SIGTERM")
		Expect(filepath.Join(dir, "grandchild-term")).To(BeAnExistingFile(), "the grandchild got SIGTERM")
		Eventually(func() bool { return processGone(sleepPID) }).Should(BeTrue(), "the grandchild's sleep is gone")
		Expect(string(run.Err.Contents())).To(ContainSubstring("lock lost"))

		l := suite.GetLock(ctx, ns, "batch")
		last := l.Status.RecentAcquisitions[len(l.Status.RecentAcquisitions)-1]
		Expect(last.LeaseID).To(Equal(leaseID))
		Expect(last.EndReason).To(Equal(locksv1alpha1.EndReasonForceReleased))
		Expect(last.Message).To(Equal("e2e: stuck batch"))
	})

	It("passes the lease in the environment, exits with the command's code and releases", func() {
		suite.NewLock(ctx, ns, "jobs", locksv1alpha1.DistributedLockSpec{})
		env := filepath.Join(dir, "env")
		s := kl(lockUser(ctx), ns, "run", "jobs", "--", "sh", "-c",
			fmt.Sprintf(`env | grep ^KUBELOCK_ > %s; exit 7`, env))
		Expect(s).To(gexec.Exit(7))
		b, err := os.ReadFile(env)
		Expect(err).NotTo(HaveOccurred())
		l := suite.GetLock(ctx, ns, "jobs")
		Expect(l.Status.Holder).To(BeNil())
		f := l.Status.RecentAcquisitions[0]
		Expect(strings.Split(strings.TrimSpace(string(b)), "\n")).To(ConsistOf(
			"KUBELOCK_FENCING_TOKEN="+strconv.FormatInt(f.FencingToken, 10),
			"KUBELOCK_LEASE_ID="+f.LeaseID,
			"KUBELOCK_LOCK="+ns+"/jobs",
			"KUBELOCK_KEY=jobs",
		))
	})

	It("stops what the command left running in its group before it releases", func() {
		suite.NewLock(ctx, ns, "jobs", locksv1alpha1.DistributedLockSpec{})
		pidFile := filepath.Join(dir, "bg.pid")
		s := kl(lockUser(ctx), ns, "run", "jobs", "--grace", "5s", "--", "sh", "-c",
			fmt.Sprintf(`sleep 1000 & echo $! > %s; exit 0`, pidFile))
		Expect(s).To(gexec.Exit(0))
		Expect(string(s.Err.Contents())).To(ContainSubstring("left processes in its group"))
		Expect(processGone(readPID(pidFile))).To(BeTrue(), "the background sleep outlived the lock")
		Expect(suite.GetLock(ctx, ns, "jobs").Status.Holder).To(BeNil())
	})

	It("forwards SIGTERM to the command and releases after it exits", func() {
		suite.NewLock(ctx, ns, "jobs", locksv1alpha1.DistributedLockSpec{})
		dumpLockOnFailure(ctx, ns, "jobs")
		script := fmt.Sprintf(`trap 'echo term > %[1]s/term; exit 3' TERM; echo up > %[1]s/up; while :; do sleep 0.05; done`, dir)
		run := start(lockUser(ctx), ns, "run", "jobs", "--", "sh", "-c", script)
		Eventually(filepath.Join).WithArguments(dir, "up").Should(BeAnExistingFile())
		run.Signal(syscall.SIGTERM)
		Eventually(run).Should(gexec.Exit(3))
		Expect(filepath.Join(dir, "term")).To(BeAnExistingFile())
		l := suite.GetLock(ctx, ns, "jobs")
		Expect(l.Status.Holder).To(BeNil())
		Expect(l.Status.RecentAcquisitions[0].EndReason).To(Equal(locksv1alpha1.EndReasonReleased))
	})

	Context("when the wrapper dies or the lease runs short", func() {
		It("kills the command and its grandchild when the wrapper is SIGKILLed, long before the lease could pass to anyone else", func() {
			const lease = 10 * time.Second
			suite.NewLock(ctx, ns, "jobs", locksv1alpha1.DistributedLockSpec{LeaseDurationSeconds: int32(lease / time.Second)})
			dumpLockOnFailure(ctx, ns, "jobs")
			run := start(lockUser(ctx), ns, "run", "jobs", "--", "sh", "-c", "sleep 300 & sleep 300")
			wrapper := run.Command.Process.Pid
			// The guard, sh (or the sleep it became) and both sleeps.
			var procs map[int]string
			Eventually(func() []string {
				procs = descendants(wrapper)
				return slices.Collect(maps.Values(procs))
			}).Should(ContainElements("sleep", "sleep"), "the command and its grandchild run")
			Expect(len(procs)).To(BeNumerically(">=", 3), "%v", procs)
			h := suite.GetLock(ctx, ns, "jobs").Status.Holder
			Expect(h).NotTo(BeNil())
			// The earliest the lease could end by the lock's own record; the
			// controller expires it only after it observed no renewal for that long.
			leaseEnd := h.AcquireTime.Add(lease)
			if h.RenewTime != nil {
				leaseEnd = h.RenewTime.Add(lease)
			}

			killed := time.Now()
			run.Kill() // SIGKILL to the wrapper alone: it can clean up nothing itself
			Eventually(func() []int {
				var alive []int
				for pid := range procs {
					if !processGone(pid) {
						alive = append(alive, pid)
					}
				}
				return alive
			}).WithPolling(time.Millisecond).Should(BeEmpty())
			gone := time.Now()
			GinkgoWriter.Printf("SIGKILL of the wrapper to command, grandchild and guard gone: %s; the lease could have passed on %s later\n",
				gone.Sub(killed), leaseEnd.Sub(gone))
			AddReportEntry("SIGKILL of the wrapper to all gone", fmt.Sprintf("%s (lease left: %s)", gone.Sub(killed), leaseEnd.Sub(gone)))
			Expect(gone).To(BeTemporally("<", leaseEnd), "the command outlived the lease")
			Expect(gone.Sub(killed)).To(BeNumerically("<", 2*time.Second))
			Eventually(run).Should(gexec.Exit())
			Expect(suite.GetLock(ctx, ns, "jobs").Status.Holder).NotTo(BeNil(), "nobody released: the lease expires")
		})

		It("sends SIGKILL when the lease's safe deadline passes, even with a longer --grace", func() {
			const lease = 5 * time.Second
			suite.NewLock(ctx, ns, "jobs", locksv1alpha1.DistributedLockSpec{LeaseDurationSeconds: int32(lease / time.Second)})
			dumpLockOnFailure(ctx, ns, "jobs")
			pidFile := filepath.Join(dir, "sleep.pid")
			// The whole group ignores SIGTERM (ignored signals are inherited).
			run := start(lockUser(ctx), ns, "run", "jobs", "--grace", "1h", "--", "sh", "-c",
				fmt.Sprintf(`trap "" TERM; sleep 300 & echo $! > %s; wait`, pidFile))
			Eventually(pidFile).Should(BeAnExistingFile())
			Eventually(func() bool { b, _ := os.ReadFile(pidFile); return strings.HasSuffix(string(b), "\n") }).Should(BeTrue())
			sleepPID := readPID(pidFile)

			Expect(kl(breakglass(ctx, ns), ns, "force-release", "jobs", "--reason", "e2e: grace cap")).To(gexec.Exit(0))
			released := time.Now()
			// The lease of the holding that was just ended cannot reach beyond this.
			leaseEnd := released.Add(lease)
			Eventually(func() bool { return processGone(sleepPID) }).WithPolling(5 * time.Millisecond).Should(BeTrue())
			gone := time.Now()
			GinkgoWriter.Printf("force-release to SIGTERM-proof group gone: %s (--grace 1h, lease %s)\n", gone.Sub(released), lease)
			AddReportEntry("force-release to gone with --grace 1h", gone.Sub(released).String())
			Expect(gone).To(BeTemporally("<", leaseEnd))
			Eventually(run).Should(gexec.Exit(icli.ExitLockLost))
			Expect(string(run.Err.Contents())).To(MatchRegexp(`lock lost.*SIGKILL in [0-9.]+m?s\)`))
		})
	})
})

// descendants are the processes below pid, by pid, with their command names.
func descendants(pid int) map[int]string {
	type proc struct {
		ppid int
		comm string
	}
	all := map[int]proc{}
	entries, err := os.ReadDir("/proc")
	Expect(err).NotTo(HaveOccurred())
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
		if err != nil {
			continue
		}
		// "pid (comm) state ppid ..."; comm may hold spaces and parentheses.
		open, end := strings.IndexByte(string(b), '('), strings.LastIndexByte(string(b), ')')
		fields := strings.Fields(string(b[end+1:]))
		if open < 0 || len(fields) < 2 || fields[0] == "Z" {
			continue
		}
		ppid, _ := strconv.Atoi(fields[1])
		all[p] = proc{ppid: ppid, comm: string(b[open+1 : end])}
	}
	out := map[int]string{}
	for changed := true; changed; {
		changed = false
		for p, pr := range all {
			if _, seen := out[p]; !seen && (pr.ppid == pid || out[pr.ppid] != "") {
				out[p], changed = pr.comm, true
			}
		}
	}
	return out
}

func atoi(s string) int64 {
	n, err := strconv.ParseInt(s, 10, 64)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return n
}

func readPID(path string) int {
	b, err := os.ReadFile(path)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return int(atoi(strings.TrimSpace(string(b))))
}

// processGone reports whether pid has exited (a zombie waiting to be reaped counts as gone).
func processGone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// The state follows the command name in parentheses: "pid (comm) S ...".
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(fields) > 0 && fields[0] == "Z"
}
