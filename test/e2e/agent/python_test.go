package agent

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/gbytes"
	"github.com/onsi/gomega/gexec"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/fencing"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/fencedstore"
	"github.com/kubelock/kubelock/test/suite"
)

// worker runs docs/examples/lock_worker.py against the agent, writing to store.
func worker(a *agentProc, store *fencedstore.Store, env ...string) *gexec.Session {
	python := requireTool("python3", "the Python example of docs/examples runs")
	cmd := exec.Command(python, repoFile("docs", "examples", "lock_worker.py"))
	cmd.Env = append(os.Environ(), append([]string{"KUBELOCK_AGENT=" + a.url, "STORE_URL=" + store.URL, "POD_NAME=" + a.user}, env...)...)
	s, err := gexec.Start(cmd, GinkgoWriter, GinkgoWriter)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() { s.Kill().Wait() })
	return s
}

// startStore serves items fenced by their locks in ns, on this machine.
func startStore(ns string, items ...string) *fencedstore.Store {
	store, err := fencedstore.Start(env.Config, "127.0.0.1:0", ns, items)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(store.Close)
	return store
}

// took is the worker's "took ITEM token T lease L" line.
var tookRE = regexp.MustCompile(`(?m)^took (\S+) token ([0-9]+) lease ([0-9a-f]+)$`)

var _ = Describe("the Python example of docs/examples (stdlib only)", func() {
	var ns string
	BeforeEach(func(ctx SpecContext) {
		ns = suite.Namespace(ctx)
		dumpOnFailure(context.Background(), ns)
	})

	It("takes a lock per work item, writes with its token and releases it", func(ctx SpecContext) {
		items := []string{"invoice-1", "invoice/2"}
		store := startStore(ns, items...)
		a := startAgent(ctx, ns)
		w := worker(a, store, "ITEMS="+strings.Join(items, " "), "STEPS=3", "STEP_SECONDS=0.1")
		Eventually(w).Should(gexec.Exit(0))
		out := string(w.Out.Contents())
		took := tookRE.FindAllStringSubmatch(out, -1)
		Expect(took).To(HaveLen(2), out)
		for i, m := range took {
			item, token, lease := m[1], m[2], m[3]
			Expect(item).To(Equal(items[i]))
			Expect(out).To(ContainSubstring(fmt.Sprintf("released %s token %s", item, token)))
			var steps []int
			for _, wr := range store.Writes() {
				if wr.Item == item {
					Expect(strconv.FormatInt(wr.Token, 10)).To(Equal(token))
					Expect(wr.Writer).To(Equal(a.user))
					steps = append(steps, wr.Step)
				}
			}
			Expect(steps).To(Equal([]int{0, 1, 2}), "every write of %s, fenced with its token", item)
			name, err := lock.NameForKey(item)
			Expect(err).NotTo(HaveOccurred())
			l := suite.GetLock(ctx, ns, name)
			Expect(l.Status.Holder).To(BeNil())
			f := l.Status.RecentAcquisitions[len(l.Status.RecentAcquisitions)-1]
			Expect(f.LeaseID).To(Equal(lease))
			Expect(strconv.FormatInt(f.FencingToken, 10)).To(Equal(token))
			Expect(f.EndReason).To(Equal(locksv1alpha1.EndReasonReleased))
		}
	})

	It("stops an item's work when its lock is lost, and the next holder's writes fence the late ones out", func(ctx SpecContext) {
		store := startStore(ns, "report")
		first := startAgent(ctx, ns)
		w := worker(first, store, "ITEMS=report", "STEPS=600", "STEP_SECONDS=0.1")
		Eventually(w.Out).Should(gbytes.Say(`took report token ([0-9]+)`))
		token := tookRE.FindStringSubmatch(string(w.Out.Contents()))[2]
		Eventually(w.Out).Should(gbytes.Say(`wrote report token ` + token + ` step 1\n`))

		forceRelease(ctx, ns, "report")
		Eventually(w, "10s").Should(gexec.Exit(0))
		out := string(w.Out.Contents())
		Expect(out).To(ContainSubstring("lost report token " + token + ": lost"))
		Expect(out).NotTo(MatchRegexp(`lost report[^\n]*\n(.|\n)*wrote`), "no write after the loss was seen")
		Expect(out).NotTo(ContainSubstring("released report"))

		// Another worker takes the lock with a higher token; a write with the
		// lost one is stale from then on.
		next := worker(startAgent(ctx, ns), store, "ITEMS=report", "STEPS=1", "STEP_SECONDS=0")
		Eventually(next).Should(gexec.Exit(0))
		nextToken := tookRE.FindStringSubmatch(string(next.Out.Contents()))[2]
		Expect(strconv.Atoi(nextToken)).To(BeNumerically(">", must(strconv.Atoi(token))))
		writes := store.Writes()
		Expect(writes[len(writes)-1].Token).To(BeEquivalentTo(must(strconv.Atoi(nextToken))))
		for i := 1; i < len(writes); i++ {
			Expect(writes[i].Token).To(BeNumerically(">=", writes[i-1].Token), "tokens only rise in the store")
		}
		late, err := http.NewRequest(http.MethodPost, store.URL+"/report", strings.NewReader(`{"writer": "late", "step": 9}`)) //nolint:noctx // a local test endpoint
		Expect(err).NotTo(HaveOccurred())
		late.Header.Set(fencing.HeaderLock, "report")
		late.Header.Set(fencing.HeaderToken, token)
		resp, err := http.DefaultClient.Do(late)
		Expect(err).NotTo(HaveOccurred())
		Expect(resp.Body.Close()).To(Succeed())
		Expect(resp.StatusCode).To(Equal(http.StatusConflict), "a write with the lost token is stale")
	})
})

func must[T any](v T, err error) T {
	Expect(err).NotTo(HaveOccurred())
	return v
}
