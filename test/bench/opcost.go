package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubelock/kubelock/pkg/lock"
)

// pairCost measures workload 2's operations the same way, interleaved: an
// uncontended acquire and its release by pkg/lock (no admission, no operator:
// the bench's "none") on a lock the client took before, on a lock it never
// saw, and raw Lease CAS (get, then update; update to release).
func pairCost(ctx context.Context, n int, apiserver proc, admin *rest.Config, cs kubernetes.Interface, ns string) error {
	kl, err := newKubelockLocker(lockClients(encJSON, &mediaTypes{}), admin, ns, 1, 30*time.Second)
	if err != nil {
		return err
	}
	ll, err := newLeaseLocker(admin, ns, 1)
	if err != nil {
		return err
	}
	if _, err := cs.CoordinationV1().Leases(ns).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "pair"}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	cl, err := client.New(admin, client.Options{})
	if err != nil {
		return err
	}
	newLock := func(name string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "locks.kubelock.io/v1alpha1", "kind": "DistributedLock",
			"metadata": map[string]any{"namespace": ns, "name": name}}}
	}
	if err := cl.Create(ctx, newLock("again")); err != nil {
		return err
	}
	if _, err := createObjects(ctx, n, 8, func(ctx context.Context, i int) error {
		return cl.Create(ctx, newLock(fmt.Sprintf("first-%d", i)))
	}); err != nil {
		return err
	}
	first := 0
	type pair struct {
		name string
		take func(ctx context.Context) (holding, error)
	}
	pairs := []pair{
		{"kubelock, a lock its client took before: PUT", func(ctx context.Context) (holding, error) { return kl.acquire(ctx, "again") }},
		{"kubelock, a lock its client never saw: GET + PUT", func(ctx context.Context) (holding, error) {
			first++
			return kl.acquire(ctx, fmt.Sprintf("first-%d", first-1))
		}},
		{"raw Lease CAS: GET + PUT", func(ctx context.Context) (holding, error) { return ll.acquire(ctx, "pair") }},
	}
	h, err := pairs[0].take(ctx) // seen from here on
	if err != nil {
		return err
	}
	if err := h.release(ctx); err != nil {
		return err
	}
	type acc struct {
		acq, rel []time.Duration
		cpu      float64
	}
	res := make([]acc, len(pairs))
	const block = 25
	for done := 0; done+block <= n; done += block {
		for i, p := range pairs {
			c0 := apiserver.cpu()
			for range block {
				t := time.Now()
				h, err := p.take(ctx)
				if err != nil {
					return fmt.Errorf("%s: %w", p.name, err)
				}
				res[i].acq = append(res[i].acq, time.Since(t))
				t = time.Now()
				if err := h.release(ctx); err != nil {
					return fmt.Errorf("%s: %w", p.name, err)
				}
				res[i].rel = append(res[i].rel, time.Since(t))
			}
			res[i].cpu += apiserver.cpu() - c0
		}
	}
	fmt.Printf("\nUncontended acquire and release, one client, closed loop, %d of each in interleaved blocks of %d; no admission (no operator on the path).\n\n", len(res[0].acq), block)
	fmt.Printf("| acquire | acquire p50 ms | p99 ms | vs Lease p50, p99 | release p50 ms | p99 ms | apiserver CPU ms per acquire + release | vs Lease |\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
	last := len(res) - 1
	la := summarize(res[last].acq)
	lcpu := res[last].cpu / float64(len(res[last].acq))
	for i, p := range pairs {
		a, r := summarize(res[i].acq), summarize(res[i].rel)
		per := res[i].cpu / float64(len(res[i].acq))
		fmt.Printf("| %s | %s | %s | %s, %s | %s | %s | %.2f | %.2f× |\n", p.name, ms(a.P50), ms(a.P99), ratio(float64(a.P50), float64(la.P50)), ratio(float64(a.P99), float64(la.P99)),
			ms(r.P50), ms(r.P99), 1000*per, per/lcpu)
	}
	return nil
}

// handoffCost measures workload 3's hand-off with one waiter, interleaved
// with single raw Lease writes (the hand-off target's yardstick): from the holder's
// Release call to the queued waiter's Acquire returning, in turns (the
// waiter then holds, and the other client queues).
func handoffCost(ctx context.Context, n int, admin *rest.Config, cs kubernetes.Interface, ns string) error {
	var clients [2]*lock.Client
	for i := range clients {
		c, err := lock.New(admin, lock.WithNamespace(ns), lock.WithIdentity(fmt.Sprintf("turn-%d", i)), lock.WithoutAutoRenew(), lock.WithAutoCreate())
		if err != nil {
			return err
		}
		clients[i] = c
	}
	held, err := clients[0].TryAcquire(ctx, "handoff")
	if err != nil {
		return err
	}
	leases := cs.CoordinationV1().Leases(ns)
	lease, err := leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "handoff"}}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	var handoffs, writes []time.Duration
	const block = 25
	for done := 0; done+block <= n; done += block {
		for range block {
			waiter := clients[(len(handoffs)+1)%2]
			queued := make(chan struct{})
			var once sync.Once
			type result struct {
				l   *lock.Lock
				at  time.Time
				err error
			}
			got := make(chan result, 1)
			go func() {
				l, err := waiter.Acquire(ctx, "handoff", lock.WithQueueCallback(func(lock.QueueStatus) { once.Do(func() { close(queued) }) }))
				got <- result{l, time.Now(), err}
			}()
			select {
			case <-queued:
			case r := <-got:
				return fmt.Errorf("the waiter did not queue: %w", r.err)
			}
			t := time.Now()
			if err := held.Release(ctx); err != nil {
				return err
			}
			r := <-got
			if r.err != nil {
				return r.err
			}
			handoffs = append(handoffs, r.at.Sub(t))
			held = r.l
		}
		for range block {
			next := lease.DeepCopy()
			now := metav1.NowMicro()
			next.Spec.RenewTime = &now
			t := time.Now()
			if lease, err = leases.Update(ctx, next, metav1.UpdateOptions{}); err != nil {
				return err
			}
			writes = append(writes, time.Since(t))
		}
	}
	h, w := summarize(handoffs), summarize(writes)
	fmt.Printf("\nHand-off with one waiter (release call to the waiter's acquire returning), %d, interleaved in blocks of %d with as many raw Lease writes; no admission (no operator on the path).\n\n", h.N, block)
	fmt.Printf("| | p50 ms | p99 ms |\n|---|---:|---:|\n| kubelock hand-off | %s | %s |\n| one raw Lease write | %s | %s |\n| ratio | %s | %s |\n",
		ms(h.P50), ms(h.P99), ms(w.P50), ms(w.P99), ratio(float64(h.P50), float64(w.P50)), ratio(float64(h.P99), float64(w.P99)))
	return held.Release(ctx)
}
