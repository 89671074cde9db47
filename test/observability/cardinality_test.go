package observability

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/rules"
	"github.com/kubelock/kubelock/test/suite"
)

// What the hostile writes below are: each names a lock nobody created, so
// every one is denied. A series per name (the hole this guards against) adds
// thousands of series and, with the long names, retains hostileLong ×
// longName bytes (30 MB, several times the suite's live heap). The spec
// takes seconds, also with -race on a loaded 2-core machine.
const (
	hostileShort = 2000 // valid names of locks that do not exist
	hostileLong  = 300  // 100 kB names, no lock's
	longName     = 100 << 10
	// heapSlack is how far the live heap may grow (it grows by about 1 MiB;
	// by 32 MiB when each name kept a series).
	heapSlack = 12 << 20
	writers   = 8
)

// fencedObjectsNamingNoLock runs last in the suite's one ordered container:
// its thousands of denials would spoil the exact counts of the scripted
// history if Ginkgo ran it first.
func fencedObjectsNamingNoLock() {
	var (
		ns       string
		attacker client.Client
	)
	BeforeAll(func(ctx SpecContext) {
		Expect(env.FencedObjectsWebhook(ctx)).To(Succeed())
		ns = suite.Namespace(ctx)
		cfg, user := suite.UserConfig(ctx)
		cfg.QPS = -1 // the writes are the load; client-go's limiter would only slow it
		var err error
		attacker, err = client.New(cfg, client.Options{Scheme: env.Scheme})
		Expect(err).NotTo(HaveOccurred())
		suite.Grant(ctx, ns, "configmap-writer", user, rbacv1.PolicyRule{
			APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"create", "update"},
		})
	})

	// fencedCreate creates a fenced ConfigMap guarded by lock with token.
	fencedCreate := func(ctx context.Context, name, lock string, token int64) error {
		return attacker.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: name,
			Labels:      map[string]string{locksv1alpha1.FencedLabel: "true"},
			Annotations: map[string]string{locksv1alpha1.FencedByAnnotation: lock, locksv1alpha1.FencingTokenAnnotation: strconv.FormatInt(token, 10)},
		}})
	}
	denied := func(err error) {
		GinkgoHelper()
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "want a webhook denial, got %v", err)
		Expect(err.Error()).To(ContainSubstring("[kubelock:"))
	}

	It("counts a stale token for an existing lock in that lock's series", func(ctx SpecContext) {
		const lockName = "config-writer"
		suite.NewLock(ctx, ns, lockName, locksv1alpha1.DistributedLockSpec{})
		holder, _ := suite.NewClient(ctx, ns)
		first, err := holder.Acquire(ctx, lockName)
		Expect(err).NotTo(HaveOccurred())
		Expect(first.Release(ctx)).To(Succeed())
		second, err := holder.Acquire(ctx, lockName)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(second.Release)

		err = fencedCreate(ctx, "settings", lockName, first.FencingToken())
		denied(err)
		Expect(err.Error()).To(ContainSubstring("[kubelock:%s]", rules.RuleStaleToken))
		Expect(manager("kubelock_webhook_stale_token_rejections_total", labels{"namespace": ns, "lock": lockName})).To(Equal(1.0))
	})

	It("keeps the operator's series and heap flat through thousands of denied writes naming new locks", func(ctx SpecContext) {
		long := func(i int) string { return fmt.Sprintf("%0*d", longName, i) }
		// One write of each kind first, so that the fixed series they touch
		// (the denial's rule, the client's 403) exist before counting.
		denied(fencedCreate(ctx, "cm-warm", "ghost-warm", 1))
		denied(fencedCreate(ctx, "cm-warm", long(0), 1))
		seriesBefore, heapBefore := series(), liveHeap()

		By(fmt.Sprintf("%d denied creates naming new locks, %d of them with %d kB names", hostileShort+hostileLong, hostileLong, longName>>10))
		writes := make(chan int, hostileShort+hostileLong)
		for i := range cap(writes) {
			writes <- i
		}
		close(writes)
		var wg sync.WaitGroup
		for range writers {
			wg.Go(func() {
				defer GinkgoRecover()
				for i := range writes {
					lock := fmt.Sprintf("ghost-%d", i)
					if i >= hostileShort {
						lock = long(i)
					}
					denied(fencedCreate(ctx, fmt.Sprintf("cm-%d", i), lock, 1))
				}
			})
		}
		wg.Wait()

		heapAfter := liveHeap() // before series() makes its own copies
		seriesAfter := series()
		GinkgoWriter.Printf("series %d -> %d, live heap %d -> %d MiB\n", len(seriesBefore), len(seriesAfter), heapBefore>>20, heapAfter>>20)
		Expect(heapAfter).To(BeNumerically("<", heapBefore+heapSlack), "the live heap grew by %d MiB", (heapAfter-heapBefore)>>20)
		newSeries := added(seriesBefore, seriesAfter)
		Expect(newSeries).To(BeEmpty(), "%d series added, e.g. %.200s", len(newSeries), strings.Join(newSeries, "\n"))
	})
}

// series is every series the manager's registry serves (what /metrics shows),
// each as its name and labels.
func series() map[string]bool {
	families, err := ctrlmetrics.Registry.Gather()
	Expect(err).NotTo(HaveOccurred())
	s := map[string]bool{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			var b strings.Builder
			b.WriteString(f.GetName())
			for _, l := range m.GetLabel() {
				fmt.Fprintf(&b, " %s=%q", l.GetName(), l.GetValue())
			}
			s[b.String()] = true
		}
	}
	return s
}

// added are the series of after that before lacks.
func added(before, after map[string]bool) []string {
	var out []string
	for s := range after {
		if !before[s] {
			out = append(out, s)
		}
	}
	return out
}

// liveHeap is the heap in use after a full collection: what the process keeps.
func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
