package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
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
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/testenv"
)

// The write-cost experiment (--write-cost N) asks what one status write of a
// DistributedLock costs the processes that serve it next to one write of a
// Lease, and which part of the CRD's schema or of the request pays for the
// difference. It starts a control plane with no admission and no operator,
// installs copies of the DistributedLock CRD under other groups (the same
// schema without its CEL rules; a status the apiserver neither validates nor
// prunes) and the bare CRD (a Lease's fields), fills a lock's status the way
// pkg/lock does (acquisitions and releases until recentAcquisitions is full,
// then one held; and a lock held once). Two more control planes serve the
// lock API from kubelock-apiserver instead, one storing JSON in its etcd and
// one CBOR (a group version is served by a CRD or by an APIService, never
// both, so each backend needs its own kube-apiserver). Then it renews each
// variant N times, closed loop, one writer, the variants interleaved in
// blocks: the client's latency, and the CPU time per write from /proc of
// every process on the write's path.

// role is a process's part on a write's path.
type role int

const (
	roleKube role = iota
	roleEtcd
	roleLockAPI
	roleLockEtcd
	nRoles
)

var roleNames = [nRoles]string{"kube-apiserver", "its etcd", "kubelock-apiserver", "lock etcd"}

// path are the processes that serve a write, by role; a zero pid is not on it.
type path [nRoles]proc

func (p path) cpu() (c [nRoles]float64) {
	for r, pr := range p {
		if pr.pid != 0 {
			c[r] = pr.cpu()
		}
	}
	return c
}

type costVariant struct {
	name  string
	path  path
	write func(ctx context.Context) (bytes int, err error)
}

func writeCost(ctx context.Context, n int) error {
	fmt.Printf("Load average at the start: %s\n", loadAvg())
	env, err := testenv.Start()
	if err != nil {
		return err
	}
	defer func() { _ = env.Stop() }()
	var onCluster path
	for _, p := range childProcs() {
		switch p.name {
		case "kube-apiserver":
			onCluster[roleKube] = p
		case "etcd":
			onCluster[roleEtcd] = p
		}
	}
	apiserver := onCluster[roleKube]
	if apiserver.pid == 0 || onCluster[roleEtcd].pid == 0 {
		return errors.New("kube-apiserver or etcd process not found")
	}
	admin := rest.CopyConfig(env.Config)
	admin.QPS = -1
	cl, err := client.New(admin, client.Options{Scheme: env.Scheme})
	if err != nil {
		return err
	}
	if err := cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: costNS}}); err != nil {
		return err
	}
	// A lock's status as pkg/lock leaves it: 8 finished holdings and one held.
	lc, err := lock.New(admin, lock.WithNamespace(costNS), lock.WithIdentity("writer-0"), lock.WithoutAutoRenew(), lock.WithAutoCreate())
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(admin)
	if err != nil {
		return err
	}
	held, err := fillLock(ctx, lc, dyn, "cost", fullRounds)
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
	if _, err := envtest.InstallCRDs(admin, envtest.CRDInstallOptions{CRDs: []*apiextensionsv1.CustomResourceDefinition{noCEL, open, bareCRD()}}); err != nil {
		return err
	}

	var variants []costVariant
	statusPut := func(name string, gvr schema.GroupVersionResource, objName string, strip, patch bool, opts ...metav1.UpdateOptions) error {
		uo := metav1.UpdateOptions{}
		if len(opts) > 0 {
			uo = opts[0]
		}
		ri := dyn.Resource(gvr).Namespace(costNS)
		var cur *unstructured.Unstructured
		switch {
		case gvr == lockGVR && objName == held.GetName():
			cur = held
		case gvr == lockGVR:
			rounds := fullRounds
			if strings.HasPrefix(objName, "fresh") {
				rounds = 0
			}
			if cur, err = fillLock(ctx, lc, dyn, objName, rounds); err != nil {
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
		variants = append(variants, costVariant{name: name, path: onCluster, write: statusRenewal(ri, cur, strip, patch, uo)})
		return nil
	}
	if err := statusPut(crdVariant, lockGVR, "cost", false, false); err != nil {
		return err
	}
	if err := bindPolicy(ctx, cl); err != nil {
		return err
	}
	if err := cl.Create(ctx, &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: costNS, Name: "cost-policy", Labels: map[string]string{policyLabel: "true"}}}); err != nil {
		return err
	}
	if err := statusPut(policyVariant, lockGVR, "cost-policy", false, false); err != nil {
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
	bare, err := bareRenewal(ctx, dyn.Resource(bareGVR).Namespace(costNS))
	if err != nil {
		return err
	}
	variants = append(variants, costVariant{name: "bare CRD (a Lease's fields; no status subresource, no CEL), its spec", path: onCluster, write: bare})
	cs, err := kubernetes.NewForConfig(admin)
	if err != nil {
		return err
	}
	lease, err := leaseRenewal(ctx, cs.CoordinationV1().Leases(costNS))
	if err != nil {
		return err
	}
	variants = append(variants, costVariant{name: leaseVariant, path: onCluster, write: lease})
	planes, err := startLockPlanes(ctx)
	defer planes.stop()
	if err != nil {
		return err
	}
	for _, p := range planes {
		vs, err := p.variants(ctx)
		if err != nil {
			return err
		}
		variants = append(variants, vs...)
	}

	res, err := measureCost(ctx, variants, n)
	if err != nil {
		return err
	}
	printCost(variants, res, n)
	printGate(variants, res)
	if err := pairCost(ctx, n, apiserver, admin, cs, costNS); err != nil {
		return err
	}
	if err := handoffCost(ctx, n, admin, cs, costNS); err != nil {
		return err
	}
	// Where the apiserver's time goes while it takes the shipped lock's writes,
	// and where kube-apiserver's and kubelock-apiserver's go while the lock
	// apiserver takes them through the APIService.
	profiles := []serverProfile{{"kube-apiserver, CRD", variants[0].write, func(ctx context.Context, d time.Duration, path string) error {
		return (&cluster{adminCS: cs}).apiserverProfile(ctx, d, path)
	}}}
	for _, v := range variants {
		if v.name == proxiedVariant(planes[0].encoding) {
			profiles = append(profiles, planes[0].profiles(v.write)...)
		}
	}
	for _, p := range profiles {
		if err := p.take(ctx); err != nil {
			return err
		}
	}
	return nil
}

// costResult is what one variant's windows measured.
type costResult struct {
	lat   []time.Duration
	bytes int
	// cpu is the CPU seconds of each process on the path, beyond its idle
	// rate, over every window; writes the writes they took.
	cpu    [nRoles]float64
	writes int
	// rounds are the per-write totals of each round's window, in order.
	rounds []float64
}

func (r *costResult) perWrite() (by [nRoles]float64, total float64) {
	for i, c := range r.cpu {
		by[i] = c / float64(r.writes)
		total += by[i]
	}
	return by, total
}

// Each round gives every variant a window of writes, then lets its servers
// settle (their watch caches, garbage collection and other work a write
// leaves behind run after it returns) before their CPU is read again, so a
// window is charged for its own writes' work and none of another's.
const (
	costWindow = 2 * time.Second
	costSettle = 300 * time.Millisecond
)

// measureCost runs windows of each variant in turn until every variant
// took at least n writes, and charges each window the CPU its path's
// processes used beyond their idle rates.
func measureCost(ctx context.Context, variants []costVariant, n int) ([]costResult, error) {
	idle, err := idleRates(ctx, variants, 3*time.Second)
	if err != nil {
		return nil, err
	}
	res := make([]costResult, len(variants))
	for slices.ContainsFunc(res, func(r costResult) bool { return r.writes < n }) {
		for i, v := range variants {
			c0, t0 := v.path.cpu(), time.Now()
			writes := 0
			for ; time.Since(t0) < costWindow; writes++ {
				t := time.Now()
				b, err := v.write(ctx)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", v.name, err)
				}
				res[i].lat = append(res[i].lat, time.Since(t))
				res[i].bytes = b
			}
			if err := sleepCtx(ctx, costSettle); err != nil {
				return nil, err
			}
			c1, elapsed := v.path.cpu(), time.Since(t0).Seconds()
			round := 0.0
			for r := range c1 {
				used := c1[r] - c0[r] - idle[v.path[r].pid]*elapsed
				res[i].cpu[r] += used
				round += used
			}
			res[i].writes += writes
			res[i].rounds = append(res[i].rounds, round/float64(writes))
		}
	}
	return res, nil
}

// idleRates are the CPU seconds per second each process on a path uses while
// nothing is written.
func idleRates(ctx context.Context, variants []costVariant, d time.Duration) (map[int]float64, error) {
	procs := map[int]proc{}
	for _, v := range variants {
		for _, p := range v.path {
			if p.pid != 0 {
				procs[p.pid] = p
			}
		}
	}
	before := map[int]float64{}
	for pid, p := range procs {
		before[pid] = p.cpu()
	}
	t0 := time.Now()
	if err := sleepCtx(ctx, d); err != nil {
		return nil, err
	}
	elapsed := time.Since(t0).Seconds()
	rates := map[int]float64{}
	for pid, p := range procs {
		rates[pid] = (p.cpu() - before[pid]) / elapsed
	}
	return rates, nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// printCost prints the table and returns each variant's CPU per write.
func printCost(variants []costVariant, res []costResult, n int) map[string]float64 {
	fmt.Printf("\nOne writer, closed loop, at least %d writes per variant in interleaved windows of %s (each followed by %s for its servers to settle); no admission webhook or policy, no operator. Body: the JSON the client sends. CPU: ms per write of each process on the path (blank: not on it), from /proc over the windows, beyond each process's idle rate; load average at the end %s.\n\n",
		n, costWindow, costSettle, loadAvg())
	fmt.Printf("| write | body bytes | p50 ms | p99 ms | %s | total | vs Lease | vs CRD |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n", strings.Join(roleNames[:], " | "))
	base := map[string]float64{}
	for i, v := range variants {
		_, base[v.name] = res[i].perWrite()
	}
	for i, v := range variants {
		d := summarize(res[i].lat)
		by, total := res[i].perWrite()
		cells := make([]string, nRoles)
		for r := range by {
			if v.path[r].pid != 0 {
				cells[r] = fmt.Sprintf("%.2f", 1000*by[r])
			}
		}
		fmt.Printf("| %s | %d | %s | %s | %s | %.2f | %s | %s |\n", v.name, res[i].bytes, ms(d.P50), ms(d.P99), strings.Join(cells, " | "),
			1000*total, ratio(total, base[leaseVariant]), ratio(total, base[crdVariant]))
	}
	return base
}

// The variants the others are compared with, and the gate's.
const (
	crdVariant    = "DistributedLock status (CRD as shipped)"
	policyVariant = "DistributedLock status, CRD as shipped and kubelock's ValidatingAdmissionPolicy"
	leaseVariant  = "Lease (coordination.k8s.io/v1, protobuf)"
	costNS        = "write-cost"
	// fullRounds of acquire and release fill recentAcquisitions (8) and one more.
	fullRounds = 9
)

// policyLabel marks the locks the run binds kubelock's status policy to.
const policyLabel = "bench.kubelock.io/admission"

// bindPolicy installs config/policy's status policy, bound to the locks
// labelled policyLabel only, and waits until it denies a write in someone
// else's name: the CRD path with kubelock's rules in kube-apiserver, as the
// lock apiserver runs them in-process.
func bindPolicy(ctx context.Context, cl client.Client) error {
	vap, binding, err := readPolicy("validating_admission_policy.yaml", true)
	if err != nil {
		return err
	}
	binding.Spec.MatchResources = &admissionregistrationv1.MatchResources{ObjectSelector: &metav1.LabelSelector{MatchLabels: map[string]string{policyLabel: "true"}}}
	if err := cl.Create(ctx, vap); err != nil {
		return err
	}
	if err := cl.Create(ctx, binding); err != nil {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		l := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: costNS, GenerateName: "policy-probe-", Labels: map[string]string{policyLabel: "true"}}}
		if err := cl.Create(ctx, l); err != nil {
			return false, err
		}
		tok, err := locksv1alpha1.NextFencingToken(l.ResourceVersion)
		if err != nil {
			return false, err
		}
		now := metav1.NowMicro()
		l.Acquire(locksv1alpha1.LockHolder{Identity: "probe", User: "somebody-else", LeaseID: "probe-lease-000000000000",
			RequestID: "probe-request", LeaseDurationSeconds: 30, AcquireTime: now, RenewTime: &now}, tok)
		err = cl.Status().Update(ctx, l)
		return err != nil && strings.Contains(err.Error(), "ValidatingAdmissionPolicy"), nil
	})
}

var lockGVR = schema.GroupVersionResource{Group: "locks.kubelock.io", Version: "v1alpha1", Resource: "distributedlocks"}

// fillLock leaves key's status as pkg/lock leaves a busy lock: rounds
// acquisitions and releases, then one held; it returns the lock as read.
func fillLock(ctx context.Context, lc *lock.Client, dyn dynamic.Interface, key string, rounds int) (*unstructured.Unstructured, error) {
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
	return dyn.Resource(lockGVR).Namespace(lc.Namespace()).Get(ctx, key, metav1.GetOptions{})
}

// renewal writes change(cur) through update, each call on the object the
// previous one returned; the size is that of the JSON the client sends.
func renewal[T any](cur T, change func(T) (T, error), update func(context.Context, T) (T, error)) func(context.Context) (int, error) {
	return func(ctx context.Context) (int, error) {
		next, err := change(cur)
		if err != nil {
			return 0, err
		}
		b, _ := json.Marshal(next)
		if cur, err = update(ctx, next); err != nil {
			return 0, err
		}
		return len(b), nil
	}
}

// statusRenewal renews the holder of cur through ri: a PUT of the whole
// object (without its managedFields when strip), or a merge patch of
// renewTime with the resourceVersion as precondition.
func statusRenewal(ri dynamic.ResourceInterface, cur *unstructured.Unstructured, strip, patch bool, uo metav1.UpdateOptions) func(context.Context) (int, error) {
	if patch {
		return func(ctx context.Context) (int, error) {
			b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": cur.GetResourceVersion()},
				"status": map[string]any{"holder": map[string]any{"renewTime": microNow()}}})
			got, err := ri.Patch(ctx, cur.GetName(), types.MergePatchType, b, metav1.PatchOptions{}, "status")
			if err != nil {
				return 0, err
			}
			cur = got
			return len(b), nil
		}
	}
	return renewal(cur, func(cur *unstructured.Unstructured) (*unstructured.Unstructured, error) {
		next := cur.DeepCopy()
		if strip {
			next.SetManagedFields(nil)
		}
		return next, unstructured.SetNestedField(next.Object, microNow(), "status", "holder", "renewTime")
	}, func(ctx context.Context, next *unstructured.Unstructured) (*unstructured.Unstructured, error) {
		return ri.UpdateStatus(ctx, next, uo)
	})
}

// bareRenewal creates a held bare lock and renews it through ri, as raw CRD
// CAS does: an update of the object the previous write returned.
func bareRenewal(ctx context.Context, ri dynamic.ResourceInterface) (func(context.Context) (int, error), error) {
	now := microNow()
	cur, err := retryCreate(ctx, ri, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": bareGVR.GroupVersion().String(), "kind": "BareLock",
		"metadata": map[string]any{"name": "cost"},
		"spec":     map[string]any{"holderIdentity": "writer-0", "leaseDurationSeconds": int64(30), "acquireTime": now, "renewTime": now, "leaseTransitions": int64(1)},
	}})
	if err != nil {
		return nil, err
	}
	return renewal(cur, func(cur *unstructured.Unstructured) (*unstructured.Unstructured, error) {
		next := cur.DeepCopy()
		return next, unstructured.SetNestedField(next.Object, microNow(), "spec", "renewTime")
	}, func(ctx context.Context, next *unstructured.Unstructured) (*unstructured.Unstructured, error) {
		return ri.Update(ctx, next, metav1.UpdateOptions{})
	}), nil
}

// leaseRenewal creates a held Lease and renews it through leases.
func leaseRenewal(ctx context.Context, leases coordinationv1client.LeaseInterface) (func(context.Context) (int, error), error) {
	id, dur := "writer-0", int32(30)
	now := metav1.NowMicro()
	lease, err := leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "cost"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &id, LeaseDurationSeconds: &dur, AcquireTime: &now, RenewTime: &now}}, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	return renewal(lease, func(cur *coordinationv1.Lease) (*coordinationv1.Lease, error) {
		next := cur.DeepCopy()
		t := metav1.NowMicro()
		next.Spec.RenewTime = &t
		return next, nil
	}, func(ctx context.Context, next *coordinationv1.Lease) (*coordinationv1.Lease, error) {
		return leases.Update(ctx, next, metav1.UpdateOptions{})
	}), nil
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
