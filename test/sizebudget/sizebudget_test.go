// Package sizebudget holds the largest DistributedLock the schema admits to
// etcd's request limit: a lock is one etcd value, and etcd refuses a request
// over --max-request-bytes (1.5 MiB by default), as a 500 that no retry
// cures. The test builds that lock through the real apiserver and measures
// it as etcd stores it.
package sizebudget

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/rules"
	"github.com/kubelock/kubelock/test/crdcost"
	"github.com/kubelock/kubelock/test/testenv"
)

const (
	// etcdLimit is etcd's default --max-request-bytes.
	etcdLimit = 1536 * 1024
	// envelope is what the request adds to the stored value, with room to
	// spare: the key (twice: the put and the compare), the transaction's
	// framing, and encryption at rest (a provider's prefix, nonce and tag,
	// or KMS v2's encrypted key) — under a kilobyte each.
	envelope = 64 * 1024
	// budget is the most a lock may take in etcd.
	budget = etcdLimit - envelope
	// updateManagers is how many Update entries the apiserver keeps in
	// managedFields (the oldest beyond it merge into one).
	updateManagers = 10
)

// TestLargestLockFitsEtcd builds the largest lock the schema admits, as its
// writers would: every list at its cap (64 shared holders, 128 waiters, 8
// finished holdings, 8 conditions), every string at its longest and made of
// the character its schema admits that costs most once stored as JSON (6
// bytes for a character JSON escapes as \uXXXX: a control character, or <, >
// and & that Go's encoder escapes for HTML), every number and time at its
// longest; metadata as large as a lock user may create it; managedFields as
// the apiserver records them after those writes (ten Update managers, each
// holding renewed by another manager than its creator's, and a lock user's
// server-side apply entries, each owning all of status). No admission runs
// here: only the CRD bounds the writes.
func TestLargestLockFitsEtcd(t *testing.T) {
	ctx := context.Background()
	w := worstOf(t, crdcost.GeneratedCRD())

	lock := w.lock()
	key := types.NamespacedName{Namespace: lock.Namespace, Name: lock.Name}
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: lock.Namespace}}); err != nil {
		t.Fatal(err)
	}
	u := w.unstructured(lock)
	status := u.Object["status"]
	delete(u.Object, "status")
	if err := env.Client.Create(ctx, u, client.FieldOwner(w.manager(0))); err != nil {
		t.Fatalf("creating the lock: %v", err)
	}

	// The holdings and the queue, a tenth by each of ten managers; then each
	// holding renewed by the next manager, so that two own a part of it.
	full := as[map[string]any](t, status)
	shared, waiters := as[[]any](t, full["sharedHolders"]), as[[]any](t, full["waiters"])
	for m := range updateManagers {
		part := copyMap(full)
		part["sharedHolders"] = shared[:len(shared)*(m+1)/updateManagers]
		part["waiters"] = waiters[:len(waiters)*(m+1)/updateManagers]
		part["holderCount"], part["waiterCount"] = int64(len(shared)*(m+1)/updateManagers), int64(len(waiters)*(m+1)/updateManagers)
		u.Object["status"] = part
		if err := env.Client.Status().Update(ctx, u, client.FieldOwner(w.manager(m))); err != nil {
			t.Fatalf("status write %d: %v", m, err)
		}
	}
	for m := range updateManagers {
		renewed := copyMap(full)
		holders := make([]any, len(shared))
		for i, h := range shared {
			h := copyMap(as[map[string]any](t, h))
			if i*updateManagers/len(shared) == m {
				h["renewTime"] = w.renewed()
			}
			holders[i] = h
		}
		renewed["sharedHolders"] = holders
		u.Object["status"] = renewed
		if err := env.Client.Status().Update(ctx, u, client.FieldOwner(w.manager((m+1)%updateManagers))); err != nil {
			t.Fatalf("renewal by manager %d: %v", m, err)
		}
		full, shared = renewed, holders
	}
	// A lock user's server-side applies of all of status, each under a
	// manager of its own (admission lets a write add one while fewer than
	// rules.MaxManagedFields exist).
	for m := range rules.MaxManagedFields {
		apply := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": locksv1alpha1.GroupVersion.String(), "kind": "DistributedLock",
			"metadata": map[string]any{"name": key.Name, "namespace": key.Namespace},
			"status":   full,
		}}
		if err := env.Client.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(apply), client.FieldOwner(w.manager(updateManagers+m))); err != nil {
			t.Fatalf("apply %d: %v", m, err)
		}
	}

	stored := measure(t, locksv1alpha1.GroupVersion.WithResource("distributedlocks").GroupResource(), key)
	w.checkBuilt(t, stored.object)
}

// env is the control plane the tests write through, and read etcd of.
var env *testenv.Env

func TestMain(m *testing.M) {
	var err error
	if env, err = testenv.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	if err := env.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	os.Exit(code)
}

// measure reads the object at key of gr as etcd stores it, logs its size and
// its parts', and fails t when it is over the budget.
func measure(t *testing.T, gr schema.GroupResource, key types.NamespacedName) stored {
	t.Helper()
	raw, err := env.Stored(context.Background(), gr, key)
	if err != nil {
		t.Fatal(err)
	}
	s := parts(t, raw)
	t.Logf("the largest %s takes %d bytes in etcd (budget %d, limit %d): %s", gr.Resource, len(raw), budget, etcdLimit, s)
	if len(raw) > budget {
		t.Errorf("the largest %s the schema admits takes %d bytes in etcd, more than the budget of %d (etcd's limit %d less %d for the request's envelope): %s",
			gr.Resource, len(raw), budget, etcdLimit, envelope, s)
	}
	return s
}

// worst makes the longest value of each field the schema admits, of the
// characters that cost most once stored as JSON.
type worst struct {
	t      *testing.T
	schema *apiextensionsv1.JSONSchemaProps
}

// worstOf is worst for the one schema of the CRD in path.
func worstOf(t *testing.T, path string) worst {
	t.Helper()
	crd, err := crdcost.ReadCRD(path)
	if err != nil {
		t.Fatal(err)
	}
	return worst{t: t, schema: crd.Spec.Versions[0].Schema.OpenAPIV3Schema}
}

// costliest are characters in falling order of their size in stored JSON.
var costliest = []string{
	"\x00",       // a control character: \u0000
	"<",          // escaped for HTML by Go's encoder: \u003c
	"\U0001F512", // 4 bytes of UTF-8
	`"`,          // \"
	"é",          // 2 bytes of UTF-8
	"a",
}

// str is the longest value of the string field at path (dot-separated, from
// the lock's schema; list items are entered on their own), made of the
// costliest character its pattern admits.
func (w worst) str(path string) string {
	w.t.Helper()
	p := w.prop(path)
	if p.MaxLength == nil {
		w.t.Fatalf("%s has no maxLength", path)
	}
	n := int(*p.MaxLength)
	if path == "status.conditions.message" {
		n = locksv1alpha1.MaxConditionMessage // the list's CEL rule
	}
	for _, c := range costliest {
		if s := strings.Repeat(c, n); p.Pattern == "" || regexp.MustCompile(p.Pattern).MatchString(s) {
			return s
		}
	}
	w.t.Fatalf("%s: no value of %d characters made of one character matches %s", path, n, p.Pattern)
	return ""
}

// prop is the schema of path.
func (w worst) prop(path string) apiextensionsv1.JSONSchemaProps {
	p := *w.schema
	for _, name := range strings.Split(path, ".") {
		if p.Items != nil {
			p = *p.Items.Schema
		}
		next, ok := p.Properties[name]
		if !ok {
			w.t.Fatalf("the schema has no %s", path)
		}
		p = next
	}
	return p
}

// unique is s with its tail replaced by i, so that keys differ.
func unique(s string, i int) string {
	tail := fmt.Sprintf("%04d", i)
	return s[:len(s)-len(tail)] + tail
}

// manager is the i-th field manager's name: the longest the apiserver takes
// (128 printable characters), of the costliest printable character.
func (w worst) manager(i int) string { return unique(strings.Repeat("<", 128), i) }

// microTime and longTime are a MicroTime and a Time at their longest (an
// offset rather than Z, every fractional digit); i makes them differ.
func (w worst) microTime(i int) string {
	return fmt.Sprintf("2026-12-31T23:59:%02d.999999+05:30", i%60)
}

// renewed is a renewTime no holding had before, as long as microTime's.
func (w worst) renewed() string { return "2026-12-30T23:59:59.999999+05:30" }

func (w worst) longTime() string { return "2026-12-31T23:59:59.999999999+05:30" }

// lock is the largest lock, as a typed object whose times are set by
// unstructured (Go writes times in UTC, the shortest form).
func (w worst) lock() *locksv1alpha1.DistributedLock {
	maxInt := int64(math.MaxInt64)
	l := &locksv1alpha1.DistributedLock{
		ObjectMeta: largestCreatedMeta(),
		Spec: locksv1alpha1.DistributedLockSpec{
			Type: locksv1alpha1.RWMutex, LeaseDurationSeconds: 3600, MaxLeaseDurationSeconds: 3600,
			MaxWaiters: ptr.To[int32](locksv1alpha1.MaxWaitersLimit), HandoffTimeoutSeconds: 3600,
			MaxWaitersPerUser: ptr.To[int32](locksv1alpha1.MaxWaitersLimit), MaxWaitSeconds: locksv1alpha1.MaxWaitSecondsLimit,
		},
	}
	s := &l.Status
	holder := locksv1alpha1.LockHolder{
		Identity: w.str("status.sharedHolders.identity"), User: w.str("status.sharedHolders.user"),
		LeaseID: w.str("status.sharedHolders.leaseID"), RequestID: w.str("status.sharedHolders.requestID"),
		LeaseDurationSeconds: 3600, PodName: w.str("status.sharedHolders.podName"),
		PodUID: "0b7e4b6c-6f3a-4d5e-9c1a-2f0e8d7c6b5a", Session: w.str("status.sharedHolders.session"),
	}
	for i := range locksv1alpha1.MaxSharedHolders {
		h := holder
		h.LeaseID, h.RequestID = unique(h.LeaseID, i), unique(h.RequestID, i)
		s.SharedHolders = append(s.SharedHolders, locksv1alpha1.SharedHolder{LockHolder: h, FencingToken: maxInt, Slot: int32(locksv1alpha1.MaxSharedHolders - 1 - i)})
	}
	for i := range locksv1alpha1.MaxWaitersLimit {
		s.Waiters = append(s.Waiters, locksv1alpha1.Waiter{
			Identity: w.str("status.waiters.identity"), User: w.str("status.waiters.user"),
			RequestID: unique(w.str("status.waiters.requestID"), i), PodName: w.str("status.waiters.podName"),
			PodUID: holder.PodUID, Mode: locksv1alpha1.Exclusive, Session: w.str("status.waiters.session"),
		})
	}
	for i := range locksv1alpha1.MaxRecentAcquisitions {
		s.RecentAcquisitions = append(s.RecentAcquisitions, locksv1alpha1.FinishedHolding{
			RequestID: unique(w.str("status.recentAcquisitions.requestID"), i), LeaseID: w.str("status.recentAcquisitions.leaseID"),
			FencingToken: maxInt, Identity: w.str("status.recentAcquisitions.identity"), EndReason: locksv1alpha1.EndReasonSessionExpired,
			EndedBy: w.str("status.recentAcquisitions.endedBy"), Slot: ptr.To[int32](locksv1alpha1.StoredListLimit - 1),
			Message: w.str("status.recentAcquisitions.message"),
		})
	}
	for i := range locksv1alpha1.MaxConditions {
		s.Conditions = append(s.Conditions, metav1.Condition{
			Type: unique(w.str("status.conditions.type"), i), Status: metav1.ConditionUnknown, ObservedGeneration: maxInt,
			Reason: w.str("status.conditions.reason"), Message: w.str("status.conditions.message"),
		})
	}
	s.HolderCount, s.WaiterCount = int32(len(s.SharedHolders)), int32(len(s.Waiters))
	s.FencingToken, s.Transitions, s.ObservedGeneration = maxInt, maxInt, maxInt
	return l
}

// largestCreatedMeta is the largest metadata a lock user may create an
// object with (a lock or a session; admission bounds both alike): a name of
// 253 characters in a namespace of 63; 16 labels (rules.maxCreateMeta), keys
// at their longest (a 253-character prefix and a 63-character name) and
// values of 63 characters; 16 annotations of rules.MaxCreateAnnotationBytes
// in all, keys as short as they come so that the values, of any characters,
// take the rest.
func largestCreatedMeta() metav1.ObjectMeta {
	m := metav1.ObjectMeta{Name: dnsName(253), Namespace: dnsLabel(63), Labels: map[string]string{}, Annotations: map[string]string{}}
	for i := range 16 {
		k := dnsName(253) + "/" + unique(strings.Repeat("k", 63), i)
		m.Labels[k] = strings.Repeat("v", 63)
		m.Annotations[string(rune('a'+i))] = strings.Repeat("\x00", rules.MaxCreateAnnotationBytes/16-1)
	}
	return m
}

// unstructured is l as JSON with every time at its longest.
func (w worst) unstructured(l *locksv1alpha1.DistributedLock) *unstructured.Unstructured {
	w.t.Helper()
	u := toUnstructured(w.t, l, "DistributedLock")
	status := as[map[string]any](w.t, u.Object["status"])
	for _, list := range []string{"sharedHolders", "waiters", "recentAcquisitions", "conditions"} {
		for i, e := range as[[]any](w.t, status[list]) {
			e := as[map[string]any](w.t, e)
			for _, f := range []string{"acquireTime", "renewTime", "enqueueTime", "deadline", "endTime"} {
				if _, ok := e[f]; ok || list == "sharedHolders" && f == "renewTime" {
					e[f] = w.microTime(i)
				}
			}
			if list == "conditions" {
				e["lastTransitionTime"] = w.longTime()
			}
		}
	}
	return u
}

// toUnstructured is obj, an object of kind in the lock API, as JSON.
func toUnstructured(t *testing.T, obj any, kind string) *unstructured.Unstructured {
	t.Helper()
	b, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: map[string]any{}}
	if err := utiljson.Unmarshal(b, &u.Object); err != nil {
		t.Fatal(err)
	}
	u.SetAPIVersion(locksv1alpha1.GroupVersion.String())
	u.SetKind(kind)
	return u
}

// checkBuilt fails t unless obj, the lock as stored, has every list at its
// cap and the strings and times at the lengths asked for: the apiserver
// prunes and defaults, and a test that measured a smaller lock than it
// meant to would prove nothing.
func (w worst) checkBuilt(t *testing.T, obj map[string]any) {
	t.Helper()
	status := as[map[string]any](t, obj["status"])
	for list, want := range map[string]int{
		"sharedHolders": locksv1alpha1.MaxSharedHolders, "waiters": locksv1alpha1.MaxWaitersLimit,
		"recentAcquisitions": locksv1alpha1.MaxRecentAcquisitions, "conditions": locksv1alpha1.MaxConditions,
	} {
		if got := len(as[[]any](t, status[list])); got != want {
			t.Errorf("status.%s has %d entries as stored, want %d", list, got, want)
		}
	}
	h := as[map[string]any](t, as[[]any](t, status["sharedHolders"])[0])
	for f, want := range map[string]string{"identity": w.str("status.sharedHolders.identity"), "user": w.str("status.sharedHolders.user"), "renewTime": w.renewed()} {
		if h[f] != want {
			t.Errorf("a shared holder's %s was stored as %.40q…, want %.40q…", f, h[f], want)
		}
	}
	t.Logf("managedFields has %d entries as stored", len(as[[]any](t, as[map[string]any](t, obj["metadata"])["managedFields"])))
}

// stored is a lock as etcd holds it, and the sizes of its parts.
type stored struct {
	object                                map[string]any
	status, managedFields, metadata, spec int
}

func (s stored) String() string {
	return fmt.Sprintf("status %d, managedFields %d, the rest of metadata %d, spec %d", s.status, s.managedFields, s.metadata-s.managedFields, s.spec)
}

func parts(t *testing.T, raw []byte) stored {
	t.Helper()
	var s stored
	if err := json.Unmarshal(raw, &s.object); err != nil {
		t.Fatal(err)
	}
	size := func(v any) int {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return len(b)
	}
	meta := as[map[string]any](t, s.object["metadata"])
	s.status, s.metadata, s.spec = size(s.object["status"]), size(meta), size(s.object["spec"])
	s.managedFields = size(meta["managedFields"])
	return s
}

// as is v as a T, failing t when it is not: the shapes are the ones this
// test wrote, or the apiserver stored of them.
func as[T any](t *testing.T, v any) T {
	t.Helper()
	x, ok := v.(T)
	if !ok {
		t.Fatalf("%T is not a %T", v, x)
	}
	return x
}

func copyMap(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// dnsLabel and dnsName are a DNS-1123 label and subdomain of n characters.
func dnsLabel(n int) string { return strings.Repeat("a", n) }

func dnsName(n int) string {
	var parts []string
	for n > 0 {
		l := min(n, 63)
		parts = append(parts, dnsLabel(l))
		n -= l + 1
	}
	return strings.Join(parts, ".")
}
