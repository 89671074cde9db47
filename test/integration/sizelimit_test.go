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
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/testenv"
)

// etcd refuses a request larger than --max-request-bytes (1.5 MiB by default)
// and the apiserver passes that on as a 500 with no reason. A lock with many
// long holdings and a long queue reaches it before its spec's bounds do, so
// pkg/lock must take that answer as final and say what it means. Here etcd
// takes 128 KiB, so a hundred readers reach it.
//
// The readers are not renewed, so each must stay within its lease until the
// last step releases the first of them. Taking a few hundred readers one by
// one takes 20-30 s on a 2-core machine and longer under load, so the lock's
// lease is an hour (the longest allowed): the spec relies on the whole of it
// finishing within that hour, not on the machine's speed.
var _ = Describe("a lock at the size etcd takes", func() {
	It("refuses the write that would outgrow it at once, with an error that says so, and still releases", func() {
		small, err := testenv.Start(testenv.WithEtcdArgs("max-request-bytes", "131072"))
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(small.Stop)
		ctx := context.Background()
		const ns, name = "default", "big"
		const readerLease = locksv1alpha1.MaxLeaseDurationSeconds
		Expect(small.Client.Create(ctx, &locksv1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: locksv1alpha1.DistributedLockSpec{Type: locksv1alpha1.RWMutex,
				LeaseDurationSeconds: readerLease, MaxLeaseDurationSeconds: readerLease,
				MaxWaiters: ptr.To[int32](1024), MaxWaitersPerUser: ptr.To[int32](1024)},
		})).To(Succeed())
		long := strings.Repeat("r", 240)
		shared, err := client.NewWithWatch(small.Config, client.Options{Scheme: small.Scheme})
		Expect(err).NotTo(HaveOccurred())
		newClient := func(i int) *lock.Client {
			c, err := lock.NewFromClient(shared, lock.WithNamespace(ns), lock.WithIdentity(fmt.Sprintf("%s-%04d", long, i)), lock.WithoutAutoRenew())
			Expect(err).NotTo(HaveOccurred())
			return c
		}
		isSizeLimit := func(err error) bool {
			return err != nil && strings.Contains(err.Error(), "larger than the apiserver's store takes") && strings.Contains(err.Error(), "etcdserver: request is too large")
		}

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
		Expect(len(readers)).To(BeNumerically(">=", 50))
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
})

func getLock(ctx context.Context, c client.Client, ns, name string) *locksv1alpha1.DistributedLock {
	l := &locksv1alpha1.DistributedLock{}
	Expect(c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, l)).To(Succeed())
	return l
}
