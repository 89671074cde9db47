package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
)

// etcd refuses a request larger than --max-request-bytes (1.5 MiB by default)
// and the apiserver passes that on as a 500 with no reason. The schema's
// bounds keep a lock below the default (test/sizebudget), but a cluster may
// set a lower limit, so pkg/lock must take that answer as final and say what
// it means. Here etcd takes 64 KiB, and an annotation leaves room for a
// dozen readers.
//
// The readers are not renewed, so each must stay within its lease until the
// last step releases the first of them: the lock's lease is an hour (the
// longest allowed), so the spec relies on the whole of it finishing within
// that hour, not on the machine's speed.
var _ = backends.Describe("a lock at the size etcd takes", func() {
	It("refuses the write that would outgrow it at once, with an error that says so, and still releases", func() {
		ctx := context.Background()
		small := env.another(ctx, "max-request-bytes", "65536")
		const ns, name = "default", "big"
		key := client.ObjectKey{Namespace: ns, Name: name}
		const readerLease = locksv1alpha1.MaxLeaseDurationSeconds
		Expect(small.Client.Create(ctx, &locksv1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: locksv1alpha1.DistributedLockSpec{Type: locksv1alpha1.RWMutex,
				LeaseDurationSeconds: readerLease, MaxLeaseDurationSeconds: readerLease,
				MaxWaiters: ptr.To[int32](locksv1alpha1.MaxWaitersLimit), MaxWaitersPerUser: ptr.To[int32](locksv1alpha1.MaxWaitersLimit)},
		})).To(Succeed())
		long := strings.Repeat("r", 240)
		shared, err := client.NewWithWatch(small.Config, client.Options{Scheme: small.Scheme})
		Expect(err).NotTo(HaveOccurred())
		newClient := func(i int) *lock.Client {
			c, err := lock.NewFromClient(shared, lock.WithNamespace(ns), lock.WithIdentity(fmt.Sprintf("%s-%04d", long, i)), lock.WithoutAutoRenew())
			Expect(err).NotTo(HaveOccurred())
			return c
		}

		By("an administrator's annotation takes most of what etcd takes")
		Expect(writePadding(ctx, small.Client, key, 40_000)).To(Succeed())

		By("taking readers until one no longer fits")
		var readers []*lock.Lock
		var refused error
		for i := 0; i < 1024; i++ {
			// A bounded call: a client that took the refusal for a passing
			// failure would retry until this deadline.
			cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
			l, err := newClient(i).TryAcquire(cctx, name, lock.WithShared())
			ccancel()
			if err != nil {
				refused = err
				break
			}
			readers = append(readers, l)
		}
		Expect(isSizeLimit(refused)).To(BeTrue(), "got %v", refused)
		Expect(readers).NotTo(BeEmpty())
		stored := &locksv1alpha1.DistributedLock{}
		Expect(small.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, stored)).To(Succeed())
		Expect(stored.Status.SharedHolders).To(HaveLen(len(readers)), "the refused write changed nothing")
		raw, err := json.Marshal(stored)
		Expect(err).NotTo(HaveOccurred())
		fmt.Fprintf(GinkgoWriter, "%d readers fit (%d bytes as read back); the next was refused: %v\n", len(readers), len(raw), refused)

		By("the next reader is refused at once, not retried until its deadline")
		tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		start := time.Now()
		_, err = newClient(5000).TryAcquire(tctx, name, lock.WithShared())
		Expect(isSizeLimit(err)).To(BeTrue(), "got %v", err)
		Expect(time.Since(start)).To(BeNumerically("<", 5*time.Second))

		By("a writer that would wait is told the queue is full, with the cause")
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		defer wcancel()
		var full error
		for i := 0; i < 64 && full == nil; i++ {
			done := make(chan error, 1)
			before := len(getLock(ctx, small.Client, ns, name).Status.Waiters)
			go func() {
				_, err := newClient(6000+i).Acquire(wctx, name)
				done <- err
			}()
			// Either it joined the queue (and waits behind the readers) or it was refused.
			Eventually(func() bool {
				select {
				case full = <-done:
					return true
				default:
					return len(getLock(ctx, small.Client, ns, name).Status.Waiters) > before
				}
			}).Should(BeTrue())
		}
		Expect(errors.Is(full, lock.ErrQueueFull)).To(BeTrue(), "got %v", full)
		Expect(isSizeLimit(full)).To(BeTrue(), "got %v", full)

		By("a release still fits: it makes the object smaller")
		Expect(readers[0].Release(ctx)).To(Succeed())
		wcancel()
	})

	// A queue head whose holding does not fit would fail again on every try
	// until others leave; kept in the queue, it would hold back everyone
	// behind it until the controller drops it after handoffTimeoutSeconds.
	It("a queue head whose acquisition does not fit leaves the queue at once, with an error that says so", func() {
		ctx := context.Background()
		small := env.another(ctx, "max-request-bytes", "65536")
		key := client.ObjectKey{Namespace: "default", Name: "tight"}
		Expect(small.Client.Create(ctx, &locksv1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name},
			Spec: locksv1alpha1.DistributedLockSpec{Type: locksv1alpha1.Semaphore, Permits: ptr.To[int32](1),
				LeaseDurationSeconds: locksv1alpha1.MaxLeaseDurationSeconds, MaxLeaseDurationSeconds: locksv1alpha1.MaxLeaseDurationSeconds,
				HandoffTimeoutSeconds: 3600, MaxWaiters: ptr.To[int32](locksv1alpha1.MaxWaitersLimit)},
		})).To(Succeed())
		shared, err := client.NewWithWatch(small.Config, client.Options{Scheme: small.Scheme})
		Expect(err).NotTo(HaveOccurred())
		newClient := func(identity string) *lock.Client {
			c, err := lock.NewFromClient(shared, lock.WithNamespace(key.Namespace), lock.WithIdentity(identity), lock.WithoutAutoRenew())
			Expect(err).NotTo(HaveOccurred())
			return c
		}

		By("one holder takes the only permit, the next request waits at the head")
		holding, err := newClient("holder").TryAcquire(ctx, key.Name)
		Expect(err).NotTo(HaveOccurred())
		done := make(chan error, 1)
		go func() {
			wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
			defer cancel()
			_, err := newClient("head").Acquire(wctx, key.Name, lock.WithRequestID("head"))
			done <- err
		}()
		Eventually(func() []locksv1alpha1.Waiter {
			return getLock(ctx, small.Client, key.Namespace, key.Name).Status.Waiters
		}).
			Should(ContainElement(HaveField("RequestID", "head")))

		By("an administrator's annotation grows until the lock is as large as etcd takes")
		fits := largestPadding(ctx, small.Client, key)
		fmt.Fprintf(GinkgoWriter, "the lock is as large as etcd takes with an annotation of %d bytes\n", fits)

		By("a second permit admits the head, whose holding no longer fits")
		// permits 1 -> 2 leaves the object's size as it is.
		Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
			l := getLock(ctx, small.Client, key.Namespace, key.Name)
			l.Spec.Permits = ptr.To[int32](2)
			return small.Client.Update(ctx, l)
		})).To(Succeed())
		var headErr error
		Eventually(done).Should(Receive(&headErr))

		By("the head's entry is gone as the call returns, and the holding is untouched")
		after := getLock(ctx, small.Client, key.Namespace, key.Name)
		Expect(after.Status.Waiters).NotTo(ContainElement(HaveField("RequestID", "head")), "the call ended with %v", headErr)
		Expect(after.Status.SharedHolders).To(ConsistOf(HaveField("LeaseID", holding.LeaseID())))
		Expect(errors.Is(headErr, lock.ErrTooLarge)).To(BeTrue(), "got %v", headErr)
		Expect(isSizeLimit(headErr)).To(BeTrue(), "got %v", headErr)
		Expect(headErr.Error()).To(HaveSuffix("left the queue"))
		Expect(holding.Release(ctx)).To(Succeed())
	})
})

func isSizeLimit(err error) bool {
	return isTooLarge(err) && strings.Contains(err.Error(), "larger than the apiserver's store takes")
}

// largestPadding gives the lock key the largest padding etcd takes (found
// by bisection: each try is one write, and a refused write changes nothing),
// and returns its size.
func largestPadding(ctx context.Context, c client.Client, key client.ObjectKey) int {
	fits, refused := 0, 64*1024
	for refused-fits > 1 {
		n := (fits + refused) / 2
		switch err := writePadding(ctx, c, key, n); {
		case err == nil:
			fits = n
		case isTooLarge(err):
			refused = n
		default:
			Expect(err).NotTo(HaveOccurred())
		}
	}
	return fits
}

// writePadding sets an annotation of n bytes on the lock key, which makes
// it that much larger in etcd and changes nothing else.
func writePadding(ctx context.Context, c client.Client, key client.ObjectKey, n int) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		l := getLock(ctx, c, key.Namespace, key.Name)
		metav1.SetMetaDataAnnotation(&l.ObjectMeta, "example.com/padding", strings.Repeat("p", n))
		return c.Update(ctx, l)
	})
}

// isTooLarge: etcd refused the write as larger than it takes.
func isTooLarge(err error) bool {
	return err != nil && strings.Contains(err.Error(), "etcdserver: request is too large")
}

func getLock(ctx context.Context, c client.Client, ns, name string) *locksv1alpha1.DistributedLock {
	l := &locksv1alpha1.DistributedLock{}
	Expect(c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, l)).To(Succeed())
	return l
}
