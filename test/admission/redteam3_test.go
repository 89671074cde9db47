package admission

import (
	"context"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/rules"
)

// The third red team's cases (after pod fields came only from a pod's own
// token, metric series only from existing locks and the auto-created label
// only from a default create): the holes it found, each denied by both
// engines with its rule's message. hostileEntries appends the status cases;
// the create cases are in the red team's bulk-metadata table and the session
// cases in redteamSessionEntries.

// msgRequestID is both engines' denial of a requestID status still knows.
const msgRequestID = "a new holding or queue entry needs a fresh requestID: it must differ from the holder's, from every shared holder's and from every requestID in status.recentAcquisitions"

// waiterWithRequest is w with the requestID id.
func waiterWithRequest(w locksv1alpha1.Waiter, id string) locksv1alpha1.Waiter {
	w.RequestID = id
	return w
}

func redteam3Entries() []TableEntry {
	fresh := tag(rules.RuleLeaseID) + msgRequestID
	return []TableEntry{
		// A client finds its request by requestID in status (I6), and a
		// requestID is visible to every lock user. bob queues with alice's:
		// once her holding ends he holds with it, and alice's retried acquire
		// (her response was lost) answers "request ID … belongs to user bob";
		// once he releases, his record answers it "your lease ended".
		Entry("red team 3: a waiter with the holder's requestID", hostile{state: held, by: "bob",
			do:   update(enqueue(waiterWithRequest(waiter("bob", 1), requestID("alice", 1)))),
			want: []string{fresh}}),
		Entry("red team 3: a waiter with a requestID recentAcquisitions remembers", hostile{state: heldHistory, by: "bob",
			do:   update(enqueue(waiterWithRequest(waiter("bob", 1), requestID("alice", 0)))),
			want: []string{fresh}}),
		Entry("red team 3: an acquisition with a requestID recentAcquisitions remembers", hostile{state: freeHistory, by: "bob",
			do:   update(acquire(withRequest(holder("bob", 1), requestID("alice", 0)))),
			want: []string{fresh}}),
		Entry("red team 3: a permit with the requestID of an ended permit", hostile{state: state{spec: sem3Spec, readers: []string{"alice"}}, by: "bob",
			setup: func(ctx context.Context, key client.ObjectKey) {
				Expect(write(ctx, alice, key, endShared("alice", 1, locksv1alpha1.EndReasonReleased, "alice"))).To(Succeed())
			},
			do:   update(acquireShared(withRequest(holder("bob", 1), requestID("alice", 1)), 0)),
			want: []string{fresh}}),
		// Line and paragraph separators break a log line or a table row
		// where a viewer takes them for a newline; kubelock's own escaping
		// (internal/escape) treats them as control characters, so "printable"
		// names refuse them too.
		Entry("red team 3: an identity with a line separator (U+2028)", hostile{state: free, by: "bob",
			do: update(acquire(func() locksv1alpha1.LockHolder {
				h := holder("bob", 1)
				h.Identity = "bob\u2028holder: alice"
				return h
			}())),
			want: []string{"in body should match '" + locksv1alpha1.IdentityPattern + "'"}}),
		Entry("red team 3: a Held message with a paragraph separator (U+2029)", hostile{state: held, by: "alice",
			do: setConditions(func() map[string]any {
				c := heldCond("True", locksv1alpha1.ReasonAcquired, nowRFC3339())
				c["message"] = "held\u2029Released by alice"
				return c
			}()),
			want: []string{tag(rules.RuleBookkeeping) + msgConditions}}),
	}
}

// bigAnnotations is n annotations of size bytes each, and how many bytes
// they take in all (keys and values).
func bigAnnotations(n, size int) (map[string]string, int) {
	m, total := map[string]string{}, 0
	for i := range n {
		k := fmt.Sprint("example.com/a", i)
		m[k] = strings.Repeat("v", size)
		total += len(k) + size
	}
	return m, total
}

// withAnnotations sets m as the object's annotations.
func withAnnotations(m map[string]string) func(*metav1.ObjectMeta) {
	return func(o *metav1.ObjectMeta) { o.Annotations = m }
}

// bulkAnnotationEntries are the red team's creates that carry an
// operator's cache's worth of annotations: the apiserver takes 256 kB per
// object, and the controller caches every lock and session it watches.
func bulkAnnotationEntries() []TableEntry {
	big, n := bigAnnotations(16, 15900)
	key := map[string]string{locksv1alpha1.KeyAnnotation: strings.Repeat("k", 250000)}
	bytes := func(n int) string {
		return fmt.Sprintf("metadata.annotations (%d bytes, at most %d)", n, rules.MaxCreateAnnotationBytes)
	}
	return []TableEntry{
		Entry("red team 3: 16 annotations of 250 kB in all", withAnnotations(big), bytes(n)),
		Entry("red team 3: a key annotation of 250 kB", withAnnotations(key), bytes(len(locksv1alpha1.KeyAnnotation)+250000)),
	}
}

var _ = Describe("red team 3", Ordered, ContinueOnFailure, func() {
	for _, e := range crdEngines {
		redteam3Specs(e)
	}
})

// redteam3Specs are the third red team's cases, with engine e.
func redteam3Specs(e engine) {
	Context("with the "+string(e)+" engine", func() {
		var ns string
		BeforeAll(func(ctx SpecContext) {
			activate(ctx, e)
			ns = namespace(ctx, "red3-"+string(e))
		})

		// Neither engine can tell which key a lock's name comes from (a
		// policy computes no hash), so alice may create the lock of
		// bob's key first, naming another key in its annotation. The
		// client refused such a lock ("belongs to key ..."): bob could
		// never lock his key until an administrator deleted it. The
		// annotation tells apart two keys of one name; one whose name is
		// another says nothing about this lock.
		It("lets a client take its key's lock that another user created naming another key", func(ctx SpecContext) {
			key := "orders-" + randomSuffix()
			Expect(createAs(locksv1alpha1.DistributedLockSpec{}, withAnnotations(map[string]string{locksv1alpha1.KeyAnnotation: "payments"}))(
				ctx, alice, client.ObjectKey{Namespace: ns, Name: key})).To(Succeed(), "both engines admit it")
			c, err := lock.New(bob.cfg, lock.WithNamespace(ns), lock.WithIdentity("bob"))
			Expect(err).NotTo(HaveOccurred())
			l, err := c.TryAcquire(ctx, key)
			Expect(err).NotTo(HaveOccurred())
			Expect(get(ctx, client.ObjectKey{Namespace: ns, Name: key}).Status.Holder.User).To(Equal("bob"))
			Expect(l.Release(ctx)).To(Succeed())
		})

		// The webhook reads every session a write newly names, live,
		// before its rules refuse a write that adds more than one entry:
		// one denied write of 128 waiters, each naming a session, cost 128
		// reads of the apiserver (1,024 on a lock an earlier release let
		// queue that many). A write the rules could admit names at most
		// one new session per entry it may add.
		It("reads no session for a write that adds more entries than one write may", func(ctx SpecContext) {
			key := held.build(ctx, ns)
			before := sessionGets(ctx, e)
			err := write(ctx, bob, key, func(l *locksv1alpha1.DistributedLock) {
				for i := range l.MaxWaiters() {
					w := waiter("bob", i+1)
					w.Session = fmt.Sprint("ghost-", i)
					l.Status.AppendWaiter(w)
				}
			})
			Expect(err).To(MatchError(ContainSubstring(tag(rules.RuleQueue) + "one write may add at most one waiter")))
			Expect(sessionGets(ctx, e)-before).To(BeZero(), "GETs of locksessions the write caused")
		})

		// A requestID nobody used yet is anyone's, so alice may queue
		// first with the one bob's job retries with (say, its name). bob's
		// client took her entry for its own: it never queued, reported her
		// place as its own, and timed out (or was refused at the head).
		It("tells a client whose request ID another user's queue entry took", func(ctx SpecContext) {
			key := held.build(ctx, ns)
			Expect(write(ctx, alice, key, enqueue(waiterWithRequest(waiter("alice", 1), "job-42")))).To(Succeed())
			c, err := lock.New(bob.cfg, lock.WithNamespace(ns), lock.WithIdentity("bob"))
			Expect(err).NotTo(HaveOccurred())
			_, err = c.Acquire(ctx, key.Name, lock.WithRequestID("job-42"), lock.WithWaitTimeout(5*time.Second))
			Expect(err).To(MatchError(ContainSubstring(`request ID job-42 is the queue entry of user "alice"`)))
			Expect(get(ctx, key).Status.Waiters).To(HaveLen(1), "bob's client wrote nothing")
		})
	})
}

// sessionGets is how many times the engine e has read a LockSession: GETs
// kube-apiserver served (apiserver_request_total), or the lock apiserver's
// reads of its own store (etcd_requests_total). The suite runs its specs
// one at a time, and no controller reads sessions in them.
func sessionGets(ctx context.Context, e engine) int {
	metrics, prefix, labels := raw.CoreV1().RESTClient(), "apiserver_request_total{", []string{`resource="locksessions"`, `verb="GET"`, `subresource=""`}
	if e == engineLockAPI {
		direct, err := kubernetes.NewForConfig(lockServer.Direct(env.Config))
		Expect(err).NotTo(HaveOccurred())
		metrics, prefix, labels = direct.CoreV1().RESTClient(), "etcd_requests_total{", []string{`resource="locksessions"`, `operation="get"`}
	}
	b, err := metrics.Get().AbsPath("/metrics").DoRaw(ctx)
	Expect(err).NotTo(HaveOccurred())
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, prefix) || !containsAll(line, labels) {
			continue
		}
		var v float64
		_, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v)
		Expect(err).NotTo(HaveOccurred(), line)
		n += int(v)
	}
	return n
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
