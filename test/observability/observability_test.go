package observability

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/controllers"
	"github.com/kubelock/kubelock/internal/metrics"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/suite"
	"github.com/kubelock/kubelock/test/testenv"
	"github.com/kubelock/kubelock/test/testmetrics"
)

// labels is a shorthand for a series' label set.
type labels = map[string]string

// read is the value of a series in g (a histogram's sample count).
func read(g prometheus.Gatherer, name string, l labels) float64 {
	v, err := testmetrics.Value(g, name, l)
	Expect(err).NotTo(HaveOccurred())
	return v
}

// manager reads the manager's registry, the one its /metrics endpoint serves.
func manager(name string, l labels) float64 { return read(ctrlmetrics.Registry, name, l) }

// gatedClient lets a test hold back one status write until it says go, to
// order the client's write after something the controller must observe first.
type gatedClient struct {
	client.WithWatch
	hold func(client.Object) bool
	// reached is closed when a held write arrives; release lets it through.
	reached, release chan struct{}
	once             sync.Once
}

func (g *gatedClient) Status() client.SubResourceWriter {
	return &gatedStatus{SubResourceWriter: g.WithWatch.Status(), g: g}
}

type gatedStatus struct {
	client.SubResourceWriter
	g *gatedClient
}

func (s *gatedStatus) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	if s.g.hold(obj) {
		s.g.once.Do(func() { close(s.g.reached) })
		select {
		case <-s.g.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return s.SubResourceWriter.Update(ctx, obj, opts...)
}

var _ = Describe("observability of a scripted lock history", Ordered, func() {
	var (
		ns        string
		clientReg *prometheus.Registry
		userA     string
		userB     string
		userC     string
		adminUser string
	)
	const key = "orders"

	It("counts acquire, contention, expiry, force-release and a denied write exactly", func(ctx SpecContext) {
		ns = suite.Namespace(ctx)
		suite.NewLock(ctx, ns, key, locksv1alpha1.DistributedLockSpec{})
		// The controller has seen the lock before anything happens. It writes
		// nothing to a lock nobody used; its fleet gauge shows it observed it.
		Eventually(func() float64 { return manager("kubelock_controller_locks", nil) }).Should(Equal(1.0))

		clientReg = prometheus.NewPedanticRegistry()
		withMetrics := []lock.Option{lock.WithMetrics(clientReg), lock.WithoutAutoRenew()}
		a, ua := suite.NewClient(ctx, ns, withMetrics...)
		userA = ua

		// B's acquire write is held back until the controller has seen the
		// lock free with B at the head, so the hand-off is observed.
		cfgB, ub := suite.UserConfig(ctx)
		userB = ub
		cfgB.QPS = -1
		rawB, err := client.NewWithWatch(cfgB, client.Options{Scheme: env.Scheme})
		Expect(err).NotTo(HaveOccurred())
		const requestB = "request-b"
		gate := &gatedClient{WithWatch: rawB, reached: make(chan struct{}), release: make(chan struct{}),
			hold: func(o client.Object) bool {
				l, ok := o.(*locksv1alpha1.DistributedLock)
				return ok && l.Status.Holder != nil && l.Status.Holder.RequestID == requestB
			}}
		b, err := lock.NewFromClient(gate, append([]lock.Option{lock.WithNamespace(ns), lock.WithIdentity(ub)}, withMetrics...)...)
		Expect(err).NotTo(HaveOccurred())

		adminCfg, err := env.ControllerConfig("lock-admin") // system:masters: may force-release
		Expect(err).NotTo(HaveOccurred())
		adminUser = "lock-admin"
		admin, err := lock.New(adminCfg, lock.WithNamespace(ns), lock.WithIdentity(adminUser), lock.WithMetrics(clientReg))
		Expect(err).NotTo(HaveOccurred())

		By("A acquires")
		la1, err := a.Acquire(ctx, key)
		Expect(err).NotTo(HaveOccurred())
		Eventually(func() float64 { return manager("kubelock_controller_locks_held", nil) }).Should(Equal(1.0))

		By("B fails to try, then queues")
		_, err = b.TryAcquire(ctx, key)
		Expect(err).To(MatchError(lock.ErrLocked))
		type result struct {
			l   *lock.Lock
			err error
		}
		got := make(chan result, 1)
		go func() {
			l, err := b.Acquire(ctx, key, lock.WithRequestID(requestB), lock.WithLeaseDuration(2*time.Second))
			got <- result{l, err}
		}()
		Eventually(func() float64 { return manager("kubelock_controller_waiters", nil) }).Should(Equal(1.0))

		By("A releases; the controller sees the lock free with B at the head; B takes it")
		Expect(la1.Release(ctx)).To(Succeed())
		Eventually(gate.reached).Should(BeClosed())
		Eventually(func() float64 { return manager("kubelock_controller_locks_held", nil) }).Should(Equal(0.0))
		close(gate.release)
		var rb result
		Eventually(got).Should(Receive(&rb))
		Expect(rb.err).NotTo(HaveOccurred())
		lb := rb.l

		By("B stops renewing: its client gives up at its safe deadline, the controller expires the lease")
		Eventually(lb.Done(), 10*time.Second).Should(BeClosed())
		Expect(lb.Err()).To(MatchError(lock.ErrLockLost))
		Eventually(func() float64 { return manager("kubelock_controller_expirations_total", nil) }, 10*time.Second).Should(Equal(1.0))

		By("A acquires again and renews; an administrator force-releases; A's next renewal learns it lost the lock")
		la2, err := a.Acquire(ctx, key)
		Expect(err).NotTo(HaveOccurred())
		Expect(la2.Renew(ctx)).To(Succeed())
		_, err = admin.ForceRelease(ctx, key, "stuck batch job")
		Expect(err).NotTo(HaveOccurred())
		Expect(la2.Renew(ctx)).To(MatchError(lock.ErrLockLost))
		Expect(la2.Done()).To(BeClosed())

		By("C writes itself as holder with a token the server did not issue: the webhook denies it")
		cfgC, uc := suite.UserConfig(ctx)
		userC = uc
		rawC, err := client.New(cfgC, client.Options{Scheme: env.Scheme})
		Expect(err).NotTo(HaveOccurred())
		obj := suite.GetLock(ctx, ns, key)
		token, err := locksv1alpha1.NextFencingToken(obj.ResourceVersion)
		Expect(err).NotTo(HaveOccurred())
		now := metav1.NewMicroTime(time.Now())
		obj.Acquire(locksv1alpha1.LockHolder{Identity: uc, User: uc, LeaseID: strings.Repeat("f", 32), RequestID: strings.Repeat("e", 32),
			LeaseDurationSeconds: 30, AcquireTime: now, RenewTime: &now}, token+1000)
		err = rawC.Status().Update(ctx, obj)
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "want a webhook denial, got %v", err)
		Expect(err.Error()).To(ContainSubstring("fencing-token"))

		By("the controller has observed every change of holder")
		Eventually(func() float64 {
			return manager("kubelock_controller_transitions_observed_total", labels{"kind": "ForceReleased"})
		}).Should(Equal(1.0))
		Eventually(func() float64 { return manager("kubelock_controller_locks_held", nil) }).Should(Equal(0.0))

		By("the manager's metrics")
		for _, c := range []struct {
			name string
			l    labels
			want float64
		}{
			{"kubelock_controller_transitions_observed_total", labels{"kind": "Acquired"}, 3},
			{"kubelock_controller_transitions_observed_total", labels{"kind": "Released"}, 1},
			{"kubelock_controller_transitions_observed_total", labels{"kind": "Expired"}, 1},
			{"kubelock_controller_transitions_observed_total", labels{"kind": "ForceReleased"}, 1},
			{"kubelock_controller_expirations_total", nil, 1},
			{"kubelock_controller_expiry_delay_seconds", nil, 1}, // B's lease
			{"kubelock_controller_wait_seconds", nil, 1},         // B, seen queued
			{"kubelock_controller_handoff_seconds", nil, 1},      // B, seen at the head of the free lock
			{"kubelock_controller_queue_length", nil, 3},         // one per acquisition
			{"kubelock_controller_waiters_dropped_total", nil, 0},
			{"kubelock_controller_idle_locks_deleted_total", nil, 0},
			{"kubelock_controller_reconcile_errors_total", nil, 0},
			{"kubelock_controller_events_suppressed_total", nil, 0},
			{"kubelock_controller_locks", nil, 1},
			{"kubelock_controller_locks_held", nil, 0},
			{"kubelock_controller_waiters", nil, 0},
			{"kubelock_controller_is_leader", nil, 1},
			{"kubelock_controller_leader_changes_total", nil, 1},
			{"kubelock_controller_hot_lock_acquisitions_total", labels{"namespace": ns, "lock": key}, 3},
			{"kubelock_webhook_admission_decisions_total", labels{"outcome": "denied"}, 1},
			{"kubelock_webhook_admission_decisions_total", labels{"rule": "fencing-token", "outcome": "denied"}, 1},
		} {
			Expect(manager(c.name, c.l)).To(Equal(c.want), "%s%v", c.name, c.l)
		}
		// Allowed: 8 writes of the script, plus at least the controller's expiry.
		Expect(manager("kubelock_webhook_admission_decisions_total", labels{"outcome": "allowed"})).To(BeNumerically(">=", 8))

		By("the client registry")
		for _, c := range []struct {
			name string
			l    labels
			want float64
		}{
			{"kubelock_client_operation_duration_seconds", labels{"operation": "acquire", "outcome": "success"}, 3},
			{"kubelock_client_operation_duration_seconds", labels{"operation": "try_acquire", "outcome": "locked"}, 1},
			{"kubelock_client_operation_duration_seconds", labels{"operation": "release", "outcome": "success"}, 1},
			{"kubelock_client_operation_duration_seconds", labels{"operation": "renew", "outcome": "success"}, 1},
			{"kubelock_client_operation_duration_seconds", labels{"operation": "renew", "outcome": "lost"}, 1},
			{"kubelock_client_operation_duration_seconds", labels{"operation": "force_release", "outcome": "success"}, 1},
			{"kubelock_client_operation_duration_seconds", nil, 8},
			{"kubelock_client_wait_seconds", nil, 1},
			{"kubelock_client_hold_seconds", nil, 3},
			{"kubelock_client_locks_lost_total", labels{"cause": "deadline"}, 1},
			{"kubelock_client_locks_lost_total", labels{"cause": "force_released"}, 1},
			{"kubelock_client_locks_lost_total", nil, 2},
			{"kubelock_client_conflicts_total", labels{"operation": "renew"}, 1},
			{"kubelock_client_locks_held", nil, 0},
		} {
			Expect(read(clientReg, c.name, c.l)).To(Equal(c.want), "%s%v", c.name, c.l)
		}
	})

	// The default event policy: acquisitions and releases are counted above,
	// not stored as Events (controllers.EventsAll would add them).
	It("lists the script's Events for people, in order", func(ctx SpecContext) {
		type ev struct{ Reason, Note string }
		var evs []ev
		Eventually(func(g Gomega) {
			list := &eventsv1.EventList{}
			g.Expect(env.Client.List(ctx, list, client.InNamespace(ns))).To(Succeed())
			items := slices.DeleteFunc(list.Items, func(e eventsv1.Event) bool { return e.Regarding.Name != key })
			slices.SortFunc(items, func(x, y eventsv1.Event) int {
				if c := x.EventTime.Compare(y.EventTime.Time); c != 0 {
					return c
				}
				return strings.Compare(x.Name, y.Name)
			})
			evs = nil
			for _, e := range items {
				evs = append(evs, ev{e.Reason, e.Note})
			}
			reasons := make([]string, 0, len(evs))
			for _, e := range evs {
				reasons = append(reasons, e.Reason)
			}
			g.Expect(reasons).To(Equal([]string{controllers.EventExpired, controllers.EventForceReleased}))
		}).Should(Succeed())
		Expect(evs[0].Note).To(ContainSubstring("of " + userB))
		Expect(evs[1].Note).To(ContainSubstring("ForceReleased by " + adminUser))
		held := suite.GetLock(ctx, ns, key).Status.Conditions
		Expect(held).To(ContainElement(And(
			HaveField("Type", locksv1alpha1.ConditionHeld),
			HaveField("Status", metav1.ConditionFalse),
			HaveField("Reason", string(locksv1alpha1.EndReasonForceReleased)))))
	})

	It("audits every lock status write with the writer's user", func(ctx SpecContext) {
		type entry struct {
			Verb string `json:"verb"`
			User struct {
				Username string `json:"username"`
			} `json:"user"`
			ObjectRef struct {
				Resource    string `json:"resource"`
				Subresource string `json:"subresource"`
				Namespace   string `json:"namespace"`
				Name        string `json:"name"`
			} `json:"objectRef"`
			ResponseStatus struct {
				Code int `json:"code"`
			} `json:"responseStatus"`
			RequestObject json.RawMessage `json:"requestObject"`
		}
		count := func(user string, ok bool) int {
			f, err := os.Open(auditLog)
			Expect(err).NotTo(HaveOccurred())
			defer f.Close()
			n := 0
			sc := bufio.NewScanner(f)
			sc.Buffer(make([]byte, 1<<20), 1<<24)
			for sc.Scan() {
				var e entry
				Expect(json.Unmarshal(sc.Bytes(), &e)).To(Succeed())
				r := e.ObjectRef
				if r.Resource != "distributedlocks" || r.Subresource != "status" || r.Namespace != ns || r.Name != key ||
					e.Verb != "update" || e.User.Username != user || (e.ResponseStatus.Code < 300) != ok {
					continue
				}
				Expect(e.RequestObject).NotTo(BeEmpty(), "level Request keeps the written status")
				n++
			}
			Expect(sc.Err()).NotTo(HaveOccurred())
			return n
		}
		// A: acquire, release, acquire, renew (the renewal after the
		// force-release conflicted: 409). B: enqueue, take.
		Eventually(func() int { return count(userA, true) }).Should(Equal(4))
		Expect(count(userB, true)).To(Equal(2))
		Expect(count(adminUser, true)).To(Equal(1))
		Expect(count(suite.ControllerUser, true)).To(BeNumerically(">=", 1)) // the expiry
		Expect(count(userC, false)).To(Equal(1))                             // the denied write is audited too
	})

	It("lets kubectl wait for the Held condition", func(ctx SpecContext) {
		const name = "waited"
		suite.NewLock(ctx, ns, name, locksv1alpha1.DistributedLockSpec{})
		u, err := env.AddUser(envtest.User{Name: "kubectl-user", Groups: []string{"system:masters"}}, nil)
		Expect(err).NotTo(HaveOccurred())
		kubeconfig, err := u.KubeConfig()
		Expect(err).NotTo(HaveOccurred())
		path := filepath.Join(GinkgoT().TempDir(), "kubeconfig")
		Expect(os.WriteFile(path, kubeconfig, 0o600)).To(Succeed())
		kubectl := filepath.Join(testenv.AssetsDir(), "kubectl")

		By("a wait on a free lock times out")
		out, err := exec.CommandContext(ctx, kubectl, "--kubeconfig", path, "-n", ns, "wait",
			"--for=condition=Held", "dlock/"+name, "--timeout=1s").CombinedOutput()
		Expect(err).To(HaveOccurred(), string(out))

		By("a wait started before the acquisition returns once the lock is acquired")
		var stdout, stderr syncBuffer
		cmd := exec.CommandContext(ctx, kubectl, "--kubeconfig", path, "-n", ns, "wait", "-v=6",
			"--for=condition=Held", "dlock/"+name, "--timeout=60s")
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		Expect(cmd.Start()).To(Succeed())
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		// kubectl logs its watch request at -v=6 once the watch is open.
		Eventually(stderr.String).Should(ContainSubstring("watch=true"))
		Consistently(exited, 100*time.Millisecond).ShouldNot(Receive(), "kubectl must still wait")
		c, _ := suite.NewClient(ctx, ns)
		l, err := c.Acquire(ctx, name)
		Expect(err).NotTo(HaveOccurred())
		var werr error
		Eventually(exited).Should(Receive(&werr))
		Expect(werr).NotTo(HaveOccurred(), stderr.String())
		Expect(stdout.String()).To(ContainSubstring("condition met"))

		By("a wait for Held=false returns once it is released")
		Expect(l.Release(ctx)).To(Succeed())
		out, err = exec.CommandContext(ctx, kubectl, "--kubeconfig", path, "-n", ns, "wait",
			"--for=condition=Held=false", "dlock/"+name, "--timeout=30s").CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), string(out))
		Expect(string(out)).To(ContainSubstring("condition met"))
	})

	It("keeps per-lock series bounded however many locks are used", func(ctx SpecContext) {
		series := func() int {
			n, err := testutil.GatherAndCount(ctrlmetrics.Registry, "kubelock_controller_hot_lock_acquisitions_total")
			Expect(err).NotTo(HaveOccurred())
			return n
		}
		total := func() int {
			families, err := ctrlmetrics.Registry.Gather()
			Expect(err).NotTo(HaveOccurred())
			n := 0
			for _, f := range families {
				if strings.HasPrefix(f.GetName(), "kubelock_") {
					n += len(f.GetMetric())
				}
			}
			return n
		}
		before := total()
		acquired := manager("kubelock_controller_transitions_observed_total", labels{"kind": "Acquired"})
		observed := manager("kubelock_controller_locks", nil)
		const locks = 3 * metrics.DefaultHotLocks
		for i := range locks {
			suite.NewLock(ctx, ns, fmt.Sprintf("bulk-%02d", i), locksv1alpha1.DistributedLockSpec{})
		}
		Eventually(func() float64 { return manager("kubelock_controller_locks", nil) }).Should(Equal(observed + locks))
		c, _ := suite.NewClient(ctx, ns)
		for i := range locks {
			l, err := c.Acquire(ctx, fmt.Sprintf("bulk-%02d", i))
			Expect(err).NotTo(HaveOccurred())
			Expect(l.Release(ctx)).To(Succeed())
		}
		Eventually(func() float64 {
			return manager("kubelock_controller_transitions_observed_total", labels{"kind": "Acquired"})
		}).Should(Equal(acquired + locks))
		Expect(series()).To(Equal(metrics.DefaultHotLocks))
		// 30 more locks add no series beyond the hot-lock bound.
		Expect(total() - before).To(BeNumerically("<=", metrics.DefaultHotLocks))
	})

	Context("fenced objects that name locks nobody created", fencedObjectsNamingNoLock)
})

// syncBuffer is a bytes.Buffer safe for a writing process and a reading test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
