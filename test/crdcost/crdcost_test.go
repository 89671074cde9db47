package crdcost

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	celconfig "k8s.io/apiserver/pkg/apis/cel"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/test/testenv"
)

// baselineEnv names a CRD file to compare the generated one with, e.g. an
// older commit's:
//
//	git show <commit>:config/crd/bases/locks.kubelock.io_distributedlocks.yaml > /tmp/baseline.yaml
//	KUBELOCK_BASELINE_CRD=/tmp/baseline.yaml go test -v -run TestSchemaWorkPerWrite ./test/crdcost/
const baselineEnv = "KUBELOCK_BASELINE_CRD"

// kept is every CEL rule the CRD may have: what must hold with admission off
// (docs/design.md, "The CRD's rules"). A transition rule that admission
// checks anyway does not belong here.
var kept = []Rule{
	{Path: "", Message: "holder.leaseDurationSeconds must not exceed spec.maxLeaseDurationSeconds"},
	{Path: "", Message: "the wait queue must not be longer than spec.maxWaiters"},
	{Path: "", Message: "a shared holding's leaseDurationSeconds must not exceed spec.maxLeaseDurationSeconds"},
	{Path: "", Message: "a Mutex has no shared holders"},
	{Path: "", Message: "an RWMutex has a writer or readers, never both"},
	{Path: "", Message: "a Semaphore has no exclusive holder; its permits are shared holdings"},
	{Path: "", Message: "a Semaphore has at most spec.permits holders, on slots in [0, permits)"},
	{Path: "", Message: "a Mutex's waiters are Exclusive and a Semaphore's are Shared"},
	{Path: ".spec", Message: "spec.leaseDurationSeconds must not exceed spec.maxLeaseDurationSeconds"},
	{Path: ".spec", Message: "spec.permits is required for a Semaphore and allowed only for it"},
	{Path: ".spec.permits", Message: "spec.permits may grow but never shrink", Transition: true},
	{Path: ".spec.type", Message: "spec.type is immutable; create a new lock instead", Transition: true},
	{Path: ".status", Message: "waiterCount must equal the number of waiters"},
	{Path: ".status", Message: "holderCount must equal the number of holdings, exclusive and shared"},
	{Path: ".status.fencingToken", Message: "fencingToken must not decrease", Transition: true},
	// The size budget: a lock is one etcd value.
	{Path: ".status.conditions", Message: "a condition's message is at most 256 characters"},
	{Path: ".status.sharedHolders", Message: "status.sharedHolders must not grow beyond 64 entries: a lock is one etcd value, and etcd refuses one over 1.5 MiB", Transition: true},
	{Path: ".status.waiters", Message: "status.waiters must not grow beyond 128 entries: a lock is one etcd value, and etcd refuses one over 1.5 MiB", Transition: true},
}

// TestCRDKeepsOnlyWhatMustHoldWithAdmissionOff pins the split between the
// CRD's CEL and admission: the generated CRD has exactly the kept rules, no
// rule runs per list item with oldSelf, and docs/design.md lists each.
func TestCRDKeepsOnlyWhatMustHoldWithAdmissionOff(t *testing.T) {
	rules, err := Rules(GeneratedCRD())
	if err != nil {
		t.Fatal(err)
	}
	got := make([]Rule, len(rules))
	for i, r := range rules {
		got[i] = Rule{Path: r.Path, Message: r.Message, Transition: r.Transition}
	}
	key := func(a, b Rule) int { return strings.Compare(a.Path+a.Message, b.Path+b.Message) }
	want := slices.SortedFunc(slices.Values(kept), key)
	if d := cmp.Diff(want, slices.SortedFunc(slices.Values(got), key)); d != "" {
		t.Errorf("the CRD's CEL rules (-kept +generated):\n%s", d)
	}
	design, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "docs", "design.md"))
	if err != nil {
		t.Fatal(err)
	}
	var total uint64
	for _, r := range rules {
		if r.Transition && strings.Contains(r.Path, "[*]") {
			t.Errorf("%s: a transition rule per list item (%q) runs once per entry on every write", r.Path, r.Rule)
		}
		if !strings.Contains(string(design), r.Message) {
			t.Errorf("docs/design.md does not list the CRD's rule %q", r.Message)
		}
		total += r.Cost * max(r.Calls, 1)
		t.Logf("%-22s cost %7d × %4d  %s", orRoot(r.Path), r.Cost, r.Calls, r.Message)
	}
	t.Logf("estimated total %d of the apiserver's limit of 100,000,000 per CRD", total)
}

func orRoot(p string) string {
	if p == "" {
		return "(object)"
	}
	return p
}

// write is a status write of a lock at a given size.
type write struct {
	name     string
	old, new *locksv1alpha1.DistributedLock
}

var t0 = metav1.NewMicroTime(time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC))

func lockOf(typ locksv1alpha1.LockType) *locksv1alpha1.DistributedLock {
	l := &locksv1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders-4711", UID: types.UID("0b7e4b6c-6f3a-4d5e-9c1a-2f0e8d7c6b5a"),
			ResourceVersion: "5000", Generation: 1, CreationTimestamp: metav1.NewTime(t0.Time)},
		Spec: locksv1alpha1.DistributedLockSpec{Type: typ, LeaseDurationSeconds: locksv1alpha1.DefaultLeaseDurationSeconds,
			MaxLeaseDurationSeconds: locksv1alpha1.DefaultMaxLeaseDurationSeconds, HandoffTimeoutSeconds: locksv1alpha1.DefaultHandoffTimeoutSeconds,
			MaxWaiters: ptr(int32(locksv1alpha1.MaxWaitersLimit)), MaxWaitersPerUser: ptr(int32(locksv1alpha1.MaxWaitersLimit)),
			MaxWaitSeconds: locksv1alpha1.DefaultMaxWaitSeconds},
	}
	if typ == locksv1alpha1.Semaphore {
		l.Spec.Permits = ptr(int32(locksv1alpha1.MaxSharedHolders))
	}
	// A lock that has been used: eight finished holdings.
	for i := range locksv1alpha1.MaxRecentAcquisitions {
		l.Acquire(holding("old", i), int64(1000+i))
		l.EndHolding(locksv1alpha1.EndReasonReleased, "old", t0)
	}
	l.Status.ObservedGeneration = 1
	return l
}

func ptr[T any](v T) *T { return &v }

func holding(user string, n int) locksv1alpha1.LockHolder {
	return locksv1alpha1.LockHolder{Identity: fmt.Sprintf("%s-%d", user, n), User: "system:serviceaccount:shop:" + user,
		LeaseID: fmt.Sprintf("lease-%s-%010d", user, n), RequestID: fmt.Sprintf("req-%s-%d", user, n),
		LeaseDurationSeconds: 30, AcquireTime: t0, RenewTime: &t0}
}

func queue(l *locksv1alpha1.DistributedLock, n int, mode locksv1alpha1.Mode) {
	for i := range n {
		u := fmt.Sprintf("w%d", i)
		l.Status.AppendWaiter(locksv1alpha1.Waiter{Identity: u, User: u, RequestID: "req-" + u, Mode: mode,
			EnqueueTime: t0, Deadline: metav1.NewMicroTime(t0.Add(time.Minute))})
	}
}

func renewed(h *locksv1alpha1.LockHolder) {
	t := metav1.NewMicroTime(h.RenewTime.Add(time.Second))
	h.RenewTime = &t
}

// writes are the seed mix's three writes (a third each: acquire, renew,
// release) on a Mutex, and the writes at the schema's bounds.
func writes() []write {
	var ws []write
	add := func(name string, old *locksv1alpha1.DistributedLock, edit func(*locksv1alpha1.DistributedLock)) {
		n := old.DeepCopy()
		edit(n)
		ws = append(ws, write{name, old, n})
	}
	held := lockOf(locksv1alpha1.Mutex)
	held.Acquire(holding("alice", 1), 4001)
	add("Mutex: acquire", lockOf(locksv1alpha1.Mutex), func(l *locksv1alpha1.DistributedLock) { l.Acquire(holding("alice", 1), 5001) })
	add("Mutex: renew", held, func(l *locksv1alpha1.DistributedLock) { renewed(l.Status.Holder) })
	add("Mutex: release", held, func(l *locksv1alpha1.DistributedLock) {
		l.EndHolding(locksv1alpha1.EndReasonReleased, l.Status.Holder.User, t0)
	})

	// At the lists' largest: as an earlier release, which allowed 1,024
	// holdings and waiters, may have stored them (no write grows a list past
	// this release's caps, 64 and 128).
	waiting := stored(held)
	queue(waiting, locksv1alpha1.StoredListLimit, locksv1alpha1.Exclusive)
	add("Mutex: renew, 1,024 waiters", waiting, func(l *locksv1alpha1.DistributedLock) { renewed(l.Status.Holder) })

	readers := stored(lockOf(locksv1alpha1.RWMutex))
	for i := range locksv1alpha1.StoredListLimit {
		readers.AcquireShared(holding("r", i), int32(i), int64(4000+i))
	}
	add("RWMutex: a reader renews, 1,024 readers", readers, func(l *locksv1alpha1.DistributedLock) {
		renewed(&l.Status.SharedHolders[700].LockHolder)
	})

	permits := stored(lockOf(locksv1alpha1.Semaphore))
	for i := range locksv1alpha1.MaxSharedHolders - 1 {
		permits.AcquireShared(holding("p", i), int32(i), int64(3000+i))
	}
	queue(permits, locksv1alpha1.StoredListLimit, locksv1alpha1.Shared)
	add("Semaphore: the 64th permit, 1,024 waiters", permits, func(l *locksv1alpha1.DistributedLock) {
		h := holding("w0", 1)
		h.User, h.RequestID = "w0", "req-w0"
		l.Status.RemoveWaiter("req-w0")
		l.AcquireShared(h, locksv1alpha1.MaxSharedHolders-1, 5001)
	})
	return ws
}

// stored is l as an earlier release may have stored it: 1,024 permits and
// waiters allowed (the schema ratchets a spec it no longer admits).
func stored(l *locksv1alpha1.DistributedLock) *locksv1alpha1.DistributedLock {
	l = l.DeepCopy()
	l.Spec.MaxWaiters, l.Spec.MaxWaitersPerUser = ptr(int32(locksv1alpha1.StoredListLimit)), ptr(int32(locksv1alpha1.StoredListLimit))
	if l.Spec.Permits != nil {
		l.Spec.Permits = ptr(int32(locksv1alpha1.StoredListLimit))
	}
	return l
}

type crd struct {
	name   string
	schema *Schema
}

func loadCRDs(t *testing.T) []crd {
	s, err := Load(GeneratedCRD())
	if err != nil {
		t.Fatal(err)
	}
	crds := []crd{{"generated", s}}
	if path := os.Getenv(baselineEnv); path != "" {
		b, err := Load(path)
		if err != nil {
			t.Fatal(err)
		}
		crds = append([]crd{{"baseline", b}}, crds...)
	}
	return crds
}

// TestSchemaWorkPerWrite makes the seed mix's writes and the writes at the
// schema's bounds through the CRD's schema work: each is valid and its CEL
// rules fit the apiserver's budget. With KUBELOCK_BASELINE_CRD set it also
// measures the schema work per write for both CRDs (CPU time, allocations;
// taking turns, median of rounds) and logs the comparison; the figures are
// not asserted.
func TestSchemaWorkPerWrite(t *testing.T) {
	ctx := context.Background()
	crds := loadCRDs(t)
	ws := writes()
	in := make([]Write, len(ws))
	costs := make([][]int64, len(crds))
	for i, w := range ws {
		var err error
		if in[i], err = NewWrite(w.old, w.new); err != nil {
			t.Fatal(err)
		}
		for c, cr := range crds {
			errs, cost := cr.schema.StatusUpdate(ctx, in[i])
			if len(errs) > 0 {
				t.Errorf("%s, %s CRD: %v", w.name, cr.name, errs.ToAggregate())
			}
			if cost > celconfig.RuntimeCELCostBudget/10 {
				t.Errorf("%s, %s CRD: CEL cost %d, over a tenth of the budget", w.name, cr.name, cost)
			}
			costs[c] = append(costs[c], cost)
		}
	}
	if len(crds) == 1 {
		for i, w := range ws {
			t.Logf("%-46s CEL cost %7d", w.name, costs[0][i])
		}
		t.Logf("set %s to a CRD file to time the schema work against it", baselineEnv)
		return
	}
	const rounds = 5
	type figures struct{ cpu, allocs, bytes []float64 }
	fig := make([][]figures, len(crds)) // crd, write
	for c := range crds {
		fig[c] = make([]figures, len(ws))
	}
	for range rounds {
		for i := range ws {
			for c, cr := range crds {
				cpu, allocs, bytes := measure(func() { cr.schema.StatusUpdate(ctx, in[i]) })
				f := &fig[c][i]
				f.cpu, f.allocs, f.bytes = append(f.cpu, cpu), append(f.allocs, allocs), append(f.bytes, bytes)
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n| write | CPU µs %[1]s | CPU µs %[2]s | ratio | allocations %[1]s | allocations %[2]s | ratio | kB %[1]s | kB %[2]s | CEL cost %[1]s | CEL cost %[2]s |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
		crds[0].name, crds[1].name)
	for i, w := range ws {
		a, g := fig[0][i], fig[1][i]
		fmt.Fprintf(&b, "| %s | %.0f | %.0f | %.2f | %.0f | %.0f | %.2f | %.0f | %.0f | %d | %d |\n", w.name,
			median(a.cpu)/1e3, median(g.cpu)/1e3, median(g.cpu)/median(a.cpu),
			median(a.allocs), median(g.allocs), median(g.allocs)/median(a.allocs),
			median(a.bytes)/1e3, median(g.bytes)/1e3, costs[0][i], costs[1][i])
	}
	t.Logf("schema work per status write (process CPU time, so a loaded machine inflates it less than wall time), median of %d rounds taking turns:%s", rounds, b.String())
}

// measure runs op until it took 200 ms of the process's CPU time and
// returns CPU nanoseconds, allocations and bytes allocated per run. CPU time
// includes the garbage collector's work for what op allocated.
func measure(op func()) (cpu, allocs, bytes float64) {
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	c0 := cpuTime()
	n := 0
	for cpuTime()-c0 < 200*time.Millisecond {
		op()
		n++
	}
	c1 := cpuTime()
	runtime.ReadMemStats(&m1)
	return float64(c1-c0) / float64(n), float64(m1.Mallocs-m0.Mallocs) / float64(n), float64(m1.TotalAlloc-m0.TotalAlloc) / float64(n)
}

// cpuTime is the CPU time the process used so far, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	return s[len(s)/2]
}
