package cli

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
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

// sidecarView is the JSON of the sidecar's /v1/lock.
type sidecarView struct {
	Held    bool   `json:"held"`
	Name    string `json:"name"`
	Token   int64  `json:"token"`
	LeaseID string `json:"leaseID"`
	Queue   *struct {
		Position int `json:"position"`
	} `json:"queue"`
}

var servingRE = regexp.MustCompile(`serving on (http://\S+)`)

var _ = Describe("kubelock sidecar", func() {
	It("serves the holding on /v1/lock and /readyz, keeps the token file in step, takes the lock again after losing it and releases on SIGTERM", func() {
		ctx := context.Background()
		ns := suite.Namespace(ctx)
		suite.NewLock(ctx, ns, "leader", locksv1alpha1.DistributedLockSpec{LeaseDurationSeconds: 3})
		dumpLockOnFailure(ctx, ns, "leader")
		tokenFile := filepath.Join(GinkgoT().TempDir(), "run", "token")

		// Someone else holds the lock first.
		other := lockUser(ctx)
		acq := kl(other, ns, "acquire", "leader", "--lease", "60s", "-o", "json")
		Expect(acq).To(gexec.Exit(0))
		var lease struct {
			LeaseID string `json:"leaseID"`
		}
		Expect(json.Unmarshal(acq.Out.Contents(), &lease)).To(Succeed())

		sc := start(lockUser(ctx), ns, "sidecar", "leader", "--listen", "127.0.0.1:0", "--token-file", tokenFile)
		var base string
		Eventually(func() string {
			m := servingRE.FindSubmatch(sc.Err.Contents())
			if m == nil {
				return ""
			}
			base = string(m[1])
			return base
		}).ShouldNot(BeEmpty())
		get := func(path string) (int, string) {
			resp, err := http.Get(base + path)
			if err != nil {
				return 0, err.Error()
			}
			defer func() { _ = resp.Body.Close() }()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		view := func() sidecarView {
			code, body := get("/v1/lock")
			Expect(code).To(Equal(http.StatusOK), body)
			var v sidecarView
			Expect(json.Unmarshal([]byte(body), &v)).To(Succeed())
			return v
		}

		code, _ := get("/healthz")
		Expect(code).To(Equal(http.StatusOK))
		// The exec probes of the sample: kubelock probe against the sidecar's address.
		probe := func(what string) *gexec.Session {
			return kl(other, ns, "probe", what, "--listen", strings.TrimPrefix(base, "http://"))
		}
		Expect(probe("healthz")).To(gexec.Exit(0))
		notReady := probe("readyz")
		Expect(notReady).To(gexec.Exit(icli.ExitError))
		Expect(stderrLines(notReady)).To(ConsistOf(ContainSubstring("503 Service Unavailable: lock not held")))
		Eventually(func() int {
			q := view().Queue
			if q == nil {
				return 0
			}
			return q.Position
		}).Should(Equal(1))
		Expect(view().Held).To(BeFalse())
		code, _ = get("/readyz")
		Expect(code).To(Equal(http.StatusServiceUnavailable))
		Expect(tokenFile).NotTo(BeAnExistingFile())

		Expect(kl(other, ns, "release", "leader", "--lease-id", lease.LeaseID)).To(gexec.Exit(0))
		Eventually(func() int { code, _ := get("/readyz"); return code }).Should(Equal(http.StatusOK))
		agree := func() int64 {
			v := view()
			l := suite.GetLock(ctx, ns, "leader")
			Expect(v.Held).To(BeTrue())
			Expect(l.Status.Holder).NotTo(BeNil())
			Expect(v.LeaseID).To(Equal(l.Status.Holder.LeaseID))
			Expect(v.Token).To(Equal(l.Status.FencingToken))
			b, err := os.ReadFile(tokenFile)
			Expect(err).NotTo(HaveOccurred())
			Expect(strings.TrimSpace(string(b))).To(Equal(strconv.FormatInt(v.Token, 10)))
			return v.Token
		}
		first := agree()
		Expect(probe("readyz")).To(gexec.Exit(0))
		firstLease := view().LeaseID

		// Lost (force-released): the sidecar queues again and takes the lock with a higher token.
		Expect(kl(breakglass(ctx, ns), ns, "force-release", "leader", "--reason", "e2e failover")).To(gexec.Exit(0))
		Eventually(func() string { return view().LeaseID }).ShouldNot(Equal(firstLease))
		Eventually(func() bool { return view().Held }).Should(BeTrue())
		Expect(agree()).To(BeNumerically(">", first))
		Expect(string(sc.Err.Contents())).To(ContainSubstring("lock lost"))

		lastLease := view().LeaseID
		sc.Signal(syscall.SIGTERM)
		Eventually(sc).Should(gexec.Exit(0))
		l := suite.GetLock(ctx, ns, "leader")
		Expect(l.Status.Holder).To(BeNil())
		last := l.Status.RecentAcquisitions[len(l.Status.RecentAcquisitions)-1]
		Expect(last.LeaseID).To(Equal(lastLease))
		Expect(last.EndReason).To(Equal(locksv1alpha1.EndReasonReleased))
		Expect(tokenFile).NotTo(BeAnExistingFile())
	})

	It("keeps retrying while the lock's rules deny it, and takes the lock once they allow it", func() {
		ctx := context.Background()
		ns := suite.Namespace(ctx)
		suite.NewLock(ctx, ns, "leader", locksv1alpha1.DistributedLockSpec{})
		dumpLockOnFailure(ctx, ns, "leader")
		tokenFile := filepath.Join(GinkgoT().TempDir(), "token")
		// A lease above the lock's maximum: the CRD's rule answers 422.
		sc := start(lockUser(ctx), ns, "sidecar", "leader", "--lease", "10m", "--listen", "127.0.0.1:0", "--token-file", tokenFile)
		Eventually(sc.Err).Should(gbytes.Say(`acquire failed, retrying in 1s: .*must not exceed spec.maxLeaseDurationSeconds`))
		Eventually(sc.Err).Should(gbytes.Say(`acquire failed, retrying in 2s`))
		Expect(sc.ExitCode()).To(Equal(-1), "the sidecar is still running")

		l := suite.GetLock(ctx, ns, "leader")
		l.Spec.MaxLeaseDurationSeconds = 600
		Expect(env.Client.Update(ctx, l)).To(Succeed())
		Eventually(tokenFile).Should(BeAnExistingFile())
		Expect(suite.GetLock(ctx, ns, "leader").Status.Holder).NotTo(BeNil())
		sc.Signal(syscall.SIGTERM)
		Eventually(sc).Should(gexec.Exit(0))
	})

	It("exits with the denied code when RBAC refuses it", func() {
		ctx := context.Background()
		ns := suite.Namespace(ctx)
		suite.NewLock(ctx, ns, "leader", locksv1alpha1.DistributedLockSpec{})
		sc := kl(nobody(), ns, "sidecar", "leader", "--listen", "127.0.0.1:0", "--token-file", filepath.Join(GinkgoT().TempDir(), "token"))
		Expect(sc).To(gexec.Exit(icli.ExitDenied))
		Expect(string(sc.Err.Contents())).To(ContainSubstring("forbidden"))
	})
})
