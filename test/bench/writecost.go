package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/testenv"
)

// The write-cost experiment (--write-cost N) asks what one status write of a
// DistributedLock costs the apiserver next to one write of a Lease, and which
// part of the CRD's schema or of the request pays for the difference. It
// starts a control plane with no admission and no operator, installs copies
// of the DistributedLock CRD under other groups (the same schema without its
// CEL rules; a status the apiserver neither validates nor prunes), fills a
// lock's status the way pkg/lock does (acquisitions and releases until
// recentAcquisitions is full, then one held; and a lock held once), and then renews each variant
// N times, closed loop, one writer, the variants interleaved in blocks: the
// client's latency, and the apiserver's CPU time per write from /proc.

type costVariant struct {
	name  string
	write func(ctx context.Context) (bytes int, err error)
}

func writeCost(ctx context.Context, n int) error {
	env, err := testenv.Start()
	if err != nil {
		return err
	}
	defer func() { _ = env.Stop() }()
	var apiserver proc
	for _, p := range childProcs() {
		if p.name == "kube-apiserver" {
			apiserver = p
		}
	}
	if apiserver.pid == 0 {
		return errors.New("kube-apiserver process not found")
	}
	admin := rest.CopyConfig(env.Config)
	admin.QPS = -1
	cl, err := client.New(admin, client.Options{Scheme: env.Scheme})
	if err != nil {
		return err
	}
	const ns = "write-cost"
	if err := cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return err
	}
	// A lock's status as pkg/lock leaves it: 8 finished holdings and one held.
	lc, err := lock.New(admin, lock.WithNamespace(ns), lock.WithIdentity("writer-0"), lock.WithoutAutoRenew(), lock.WithAutoCreate())
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(admin)
	if err != nil {
		return err
	}
	lockGVR := schema.GroupVersionResource{Group: "locks.kubelock.io", Version: "v1alpha1", Resource: "distributedlocks"}
	filled := func(key string) (*unstructured.Unstructured, error) {
		rounds := 9
		if strings.HasPrefix(key, "fresh") {
			rounds = 0
		}
		for range rounds {
			l, err := lc.TryAcquire(ctx, key)
			if err != nil {
				return nil, err
			}
			if err := l.Release(ctx); err != nil {
				return nil, err
			}
		}
		if _, err := lc.TryAcquire(ctx, key); err != nil {
			return nil, err
		}
		return dyn.Resource(lockGVR).Namespace(ns).Get(ctx, key, metav1.GetOptions{})
	}
	held, err := filled("cost")
	if err != nil {
		return err
	}
	status, _, _ := unstructured.NestedMap(held.Object, "status")

	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := readYAML(filepath.Join(testenv.RepoRoot(), "config", "crd", "bases", "locks.kubelock.io_distributedlocks.yaml"), crd); err != nil {
		return err
	}
	noCEL := regroup(crd, "nocel.kubelock.io")
	stripCEL(noCEL.Spec.Versions[0].Schema.OpenAPIV3Schema)
	open := regroup(crd, "open.kubelock.io")
	open.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["status"] = apiextensionsv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: ptrTo(true)}
	open.Spec.Versions[0].Schema.OpenAPIV3Schema.XValidations = nil
	if _, err := envtest.InstallCRDs(admin, envtest.CRDInstallOptions{CRDs: []*apiextensionsv1.CustomResourceDefinition{noCEL, open}}); err != nil {
		return err
	}

	var variants []costVariant
	statusPut := func(name string, gvr schema.GroupVersionResource, objName string, strip, patch bool, opts ...metav1.UpdateOptions) error {
		uo := metav1.UpdateOptions{}
		if len(opts) > 0 {
			uo = opts[0]
		}
		ri := dyn.Resource(gvr).Namespace(ns)
		var cur *unstructured.Unstructured
		switch {
		case gvr == lockGVR && objName == held.GetName():
			cur = held
		case gvr == lockGVR:
			if cur, err = filled(objName); err != nil {
				return err
			}
		default:
			u := &unstructured.Unstructured{}
			u.SetAPIVersion(gvr.GroupVersion().String())
			u.SetKind("DistributedLock")
			u.SetName(objName)
			if cur, err = retryCreate(ctx, ri, u); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			if err := unstructured.SetNestedMap(cur.Object, status, "status"); err != nil {
				return err
			}
			if cur, err = ri.UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
		variants = append(variants, costVariant{name: name, write: func(ctx context.Context) (int, error) {
			next := cur.DeepCopy()
			if strip {
				next.SetManagedFields(nil)
			}
			now := metav1.NowMicro().UTC().Format("2006-01-02T15:04:05.000000Z07:00")
			if err := unstructured.SetNestedField(next.Object, now, "status", "holder", "renewTime"); err != nil {
				return 0, err
			}
			b, _ := json.Marshal(next.Object)
			var got *unstructured.Unstructured
			var err error
			if patch {
				// What changed, with the resourceVersion as precondition.
				b, _ = json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": cur.GetResourceVersion()},
					"status": map[string]any{"holder": map[string]any{"renewTime": now}}})
				got, err = ri.Patch(ctx, cur.GetName(), types.MergePatchType, b, metav1.PatchOptions{}, "status")
			} else {
				got, err = ri.UpdateStatus(ctx, next, uo)
			}
			if err != nil {
				return 0, err
			}
			cur = got
			return len(b), nil
		}})
		return nil
	}
	if err := statusPut("DistributedLock status (CRD as shipped)", lockGVR, "cost", false, false); err != nil {
		return err
	}
	if err := statusPut("DistributedLock status, managedFields not sent", lockGVR, "cost-strip", true, false); err != nil {
		return err
	}
	if err := statusPut("DistributedLock status, fieldValidation=Ignore", lockGVR, "cost-ignore", false, false, metav1.UpdateOptions{FieldValidation: metav1.FieldValidationIgnore}); err != nil {
		return err
	}
	if err := statusPut("DistributedLock status of a fresh lock (held once, recentAcquisitions empty)", lockGVR, "fresh", false, false); err != nil {
		return err
	}
	if err := statusPut("DistributedLock status, JSON merge patch with resourceVersion", lockGVR, "cost-patch", false, true); err != nil {
		return err
	}
	if err := statusPut("same status, CRD without CEL rules", schema.GroupVersionResource{Group: noCEL.Spec.Group, Version: "v1alpha1", Resource: "distributedlocks"}, "cost", false, false); err != nil {
		return err
	}
	if err := statusPut("same status, CRD status unvalidated (preserve-unknown-fields)", schema.GroupVersionResource{Group: open.Spec.Group, Version: "v1alpha1", Resource: "distributedlocks"}, "cost", false, false); err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(admin)
	if err != nil {
		return err
	}
	leases := cs.CoordinationV1().Leases(ns)
	id, dur := "writer-0", int32(30)
	now := metav1.NowMicro()
	lease, err := leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "cost"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &id, LeaseDurationSeconds: &dur, AcquireTime: &now, RenewTime: &now}}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	variants = append(variants, costVariant{name: "Lease (coordination.k8s.io/v1, protobuf)", write: func(ctx context.Context) (int, error) {
		next := lease.DeepCopy()
		t := metav1.NowMicro()
		next.Spec.RenewTime = &t
		b, _ := json.Marshal(next)
		got, err := leases.Update(ctx, next, metav1.UpdateOptions{})
		if err != nil {
			return 0, err
		}
		lease = got
		return len(b), nil
	}})

	type acc struct {
		lat   []time.Duration
		cpu   float64
		bytes int
	}
	res := make([]acc, len(variants))
	const block = 25
	for done := 0; done < n; done += block {
		for i, v := range variants {
			c0 := apiserver.cpu()
			for range block {
				t := time.Now()
				b, err := v.write(ctx)
				if err != nil {
					return fmt.Errorf("%s: %w", v.name, err)
				}
				res[i].lat = append(res[i].lat, time.Since(t))
				res[i].bytes = b
			}
			res[i].cpu += apiserver.cpu() - c0
		}
	}
	fmt.Printf("One writer, closed loop, %d writes per variant in interleaved blocks of %d; no admission, no operator. Body: the JSON the client sends.\n\n", n, block)
	fmt.Printf("| write | body bytes | p50 ms | p99 ms | apiserver CPU ms per write | vs Lease |\n|---|---:|---:|---:|---:|---:|\n")
	base := res[len(res)-1].cpu / float64(len(res[len(res)-1].lat))
	for i, v := range variants {
		d := summarize(res[i].lat)
		per := res[i].cpu / float64(len(res[i].lat))
		fmt.Printf("| %s | %d | %s | %s | %.2f | %.2f× |\n", v.name, res[i].bytes, ms(d.P50), ms(d.P99), 1000*per, per/base)
	}
	if err := pairCost(ctx, n, apiserver, admin, cs, ns); err != nil {
		return err
	}
	if err := handoffCost(ctx, n, admin, cs, ns); err != nil {
		return err
	}
	// Where the apiserver's time goes while it takes the shipped lock's writes.
	path := filepath.Join(os.TempDir(), "kubelock-write-cost-apiserver.pprof")
	errc := make(chan error, 1)
	go func() { errc <- (&cluster{adminCS: cs}).apiserverProfile(ctx, 10*time.Second, path) }()
	for wrote := 0; ; wrote++ {
		select {
		case err := <-errc:
			if err != nil {
				return err
			}
			fmt.Printf("\nkube-apiserver while it took %d writes of the shipped lock (%s):\n\n%s", wrote, path, profileSummary(path))
			return nil
		default:
		}
		if _, err := variants[0].write(ctx); err != nil {
			return err
		}
	}
}

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
	fmt.Printf("\nUncontended acquire and release, one client, closed loop, %d of each in interleaved blocks of %d; no admission, no operator.\n\n", len(res[0].acq), block)
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
// with single raw Lease writes (the yardstick): from the holder's
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
				l, err := waiter.Acquire(ctx, "handoff", lock.OnQueue(func(lock.QueueStatus) { once.Do(func() { close(queued) }) }))
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
	fmt.Printf("\nHand-off with one waiter (release call to the waiter's acquire returning), %d, interleaved in blocks of %d with as many raw Lease writes; no admission, no operator.\n\n", h.N, block)
	fmt.Printf("| | p50 ms | p99 ms |\n|---|---:|---:|\n| kubelock hand-off | %s | %s |\n| one raw Lease write | %s | %s |\n| ratio | %s | %s |\n",
		ms(h.P50), ms(h.P99), ms(w.P50), ms(w.P99), ratio(float64(h.P50), float64(w.P50)), ratio(float64(h.P99), float64(w.P99)))
	return held.Release(ctx)
}

// regroup is a copy of crd served under group.
func regroup(crd *apiextensionsv1.CustomResourceDefinition, group string) *apiextensionsv1.CustomResourceDefinition {
	c := crd.DeepCopy()
	c.Spec.Group = group
	c.Name = c.Spec.Names.Plural + "." + group
	c.ResourceVersion = ""
	return c
}

// stripCEL removes every x-kubernetes-validations rule from s.
func stripCEL(s *apiextensionsv1.JSONSchemaProps) {
	if s == nil {
		return
	}
	s.XValidations = nil
	for k, p := range s.Properties {
		stripCEL(&p)
		s.Properties[k] = p
	}
	if s.Items != nil {
		stripCEL(s.Items.Schema)
	}
	if s.AdditionalProperties != nil {
		stripCEL(s.AdditionalProperties.Schema)
	}
}

func ptrTo[T any](v T) *T { return &v }

// retryCreate creates u, retrying while the new CRD's endpoint is not served yet.
func retryCreate(ctx context.Context, ri dynamic.ResourceInterface, u *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	var got *unstructured.Unstructured
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var err error
		got, err = ri.Create(ctx, u, metav1.CreateOptions{})
		if err != nil && strings.Contains(err.Error(), "the server could not find the requested resource") {
			return false, nil
		}
		return err == nil, err
	})
	return got, err
}
