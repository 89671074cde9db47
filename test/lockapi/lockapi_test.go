package lockapi_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/lockapi"
	"github.com/kubelock/kubelock/test/testenv"
)

// One control plane without the lock CRDs, and kubelock-apiserver serving
// the lock API to it through the APIService.
var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx := context.Background()
	// Quiet the clients TestCLIWithLockServer's commands build.
	ctrllog.SetLogger(logr.Discard())
	dir, err := os.MkdirTemp("", "kubelock-lockapi-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = os.RemoveAll(dir) }()
	if env, err = lockapi.ControlPlane(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	srv, err := startServer(ctx, dir)
	server = srv
	if srv != nil {
		defer func() { _ = srv.Stop() }()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// bin is kubelock-apiserver, built for the run; server is the one serving.
var (
	bin    string
	server *lockapi.Server
)

func startServer(ctx context.Context, dir string) (*lockapi.Server, error) {
	var err error
	if bin, err = lockapi.Build(ctx, dir); err != nil {
		return nil, err
	}
	srv, err := lockapi.Start(ctx, env, bin, dir, lockapi.Options{})
	if err != nil {
		return srv, err
	}
	err = srv.Register(ctx, env)
	return srv, err
}

// namespace creates a namespace for one test.
func namespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "lockapi-"}}
	if err := env.Client.Create(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// userConfig is a lock user's connection whose requests are counted by
// "VERB path".
func userConfig(t *testing.T, name string) (*rest.Config, *requestLog) {
	t.Helper()
	cfg, err := env.UserConfig(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	log := &requestLog{}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return log.wrap(rt) })
	return cfg, log
}

// lockClient is user's pkg/lock client in ns (identity user-0, renewing
// only when asked, creating locks on first use), with its connection.
func lockClient(t *testing.T, user, ns string) (*lock.Client, *rest.Config, *requestLog) {
	t.Helper()
	cfg, log := userConfig(t, user)
	c, err := lock.New(cfg, lock.WithNamespace(ns), lock.WithIdentity(user+"-0"), lock.WithoutAutoRenew(), lock.WithAutoCreate())
	if err != nil {
		t.Fatal(err)
	}
	return c, cfg, log
}

func TestLockServedByTheLockAPIServer(t *testing.T) {
	ctx := t.Context()
	ns := namespace(t)
	alice, _, requests := lockClient(t, "alice", ns)
	// An administrator's lock, with the CRD's defaults filled in by the server.
	created := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "orders"}}
	if err := env.Client.Create(ctx, created); err != nil {
		t.Fatal(err)
	}
	if s := created.Spec; s.Type != locksv1alpha1.Mutex || s.LeaseDurationSeconds != locksv1alpha1.DefaultLeaseDurationSeconds || ptr.Deref(s.MaxWaiters, 0) != locksv1alpha1.DefaultMaxWaiters {
		t.Fatalf("the created lock's spec lacks the CRD's defaults: %+v", s)
	}

	l, err := alice.TryAcquire(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	want, err := locksv1alpha1.NextFencingToken(created.ResourceVersion)
	if err != nil {
		t.Fatal(err)
	}
	if l.FencingToken() != want {
		t.Errorf("token %d, want the lock's resourceVersion before the acquisition (%s) + 1", l.FencingToken(), created.ResourceVersion)
	}
	stored := get(t, ns, "orders")
	if h := stored.Status.Holder; h == nil || h.LeaseID != l.LeaseID() || h.User != "alice" || stored.Status.FencingToken != want {
		t.Fatalf("stored status after the acquisition: %+v", stored.Status)
	}

	renewed := stored.Status.Holder.RenewTime
	if err := l.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if got := get(t, ns, "orders").Status.Holder; got == nil || got.LeaseID != l.LeaseID() || !renewed.Before(got.RenewTime) {
		t.Errorf("renewal did not move renewTime past %v: %+v", renewed, got)
	}

	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	released := get(t, ns, "orders").Status
	if released.Holder != nil || len(released.RecentAcquisitions) != 1 || released.RecentAcquisitions[0].EndReason != locksv1alpha1.EndReasonReleased {
		t.Fatalf("status after the release: %+v", released)
	}

	// A lock the client has seen is acquired in one round trip: a PUT of
	// status conditioned on the resourceVersion it last saw.
	requests.reset()
	again, err := alice.TryAcquire(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	if got := requests.lockRequests(); len(got) != 1 || !strings.HasPrefix(got[0], http.MethodPut+" ") || !strings.HasSuffix(got[0], "/status") {
		t.Errorf("acquiring a seen lock sent %v, want one PUT of status", got)
	}
	if err := again.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestNonHolderReleaseIsDenied(t *testing.T) {
	ctx := t.Context()
	ns := namespace(t)
	alice, _, _ := lockClient(t, "alice", ns)
	bob, _, _ := lockClient(t, "bob", ns)
	l, err := alice.TryAcquire(ctx, "payments")
	if err != nil {
		t.Fatal(err)
	}
	before := get(t, ns, l.Name())
	err = bob.ReleaseLease(ctx, "payments", l.LeaseID())
	t.Logf("bob's release: %v", err)
	if err == nil || !strings.Contains(err.Error(), "[kubelock:holder-only]") {
		t.Fatalf("bob releasing alice's lease: %v, want a denial tagged [kubelock:holder-only]", err)
	}
	if !apierrors.IsForbidden(errors.Unwrap(err)) && !strings.Contains(err.Error(), "forbidden") {
		t.Errorf("the denial is not a 403: %v", err)
	}
	if after := get(t, ns, l.Name()); after.ResourceVersion != before.ResourceVersion {
		t.Errorf("the denied release changed the lock (resourceVersion %s → %s)", before.ResourceVersion, after.ResourceVersion)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestWaiterTakesTheLockWhenItIsReleased(t *testing.T) {
	ctx := t.Context()
	ns := namespace(t)
	alice, _, _ := lockClient(t, "alice", ns)
	bob, _, _ := lockClient(t, "bob", ns)
	held, err := alice.TryAcquire(ctx, "queue")
	if err != nil {
		t.Fatal(err)
	}
	queued := make(chan struct{})
	var once sync.Once
	type result struct {
		l   *lock.Lock
		err error
	}
	got := make(chan result, 1)
	go func() {
		l, err := bob.Acquire(ctx, "queue", lock.WithQueueCallback(func(lock.QueueStatus) { once.Do(func() { close(queued) }) }))
		got <- result{l, err}
	}()
	select {
	case <-queued:
	case r := <-got:
		t.Fatalf("bob did not queue: %v", r.err)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Bob learns of the release from its watch, through kube-apiserver's proxy.
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.l.FencingToken() <= held.FencingToken() {
		t.Errorf("bob's token %d is not above alice's %d", r.l.FencingToken(), held.FencingToken())
	}
	if err := r.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestVerbsAreAskedOfTheAuthorizer: the rules' verb checks are answered by
// kube-apiserver's RBAC, through the lock apiserver's delegated authorizer.
func TestVerbsAreAskedOfTheAuthorizer(t *testing.T) {
	ctx := t.Context()
	ns := namespace(t)
	alice, aliceCfg, _ := lockClient(t, "alice", ns)
	bob, _, _ := lockClient(t, "bob", ns)
	carol, carolCfg, _ := lockClient(t, "carol", ns)
	grant(t, "carol", "update", "force-release")
	custom := func(name string) *locksv1alpha1.DistributedLock {
		return &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: locksv1alpha1.DistributedLockSpec{MaxWaiters: ptr.To[int32](5)}}
	}
	err := userClient(t, aliceCfg).Create(ctx, custom("by-alice"))
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "[kubelock:create]") {
		t.Errorf("a lock user creating a lock with a spec of its own: %v, want a 403 tagged [kubelock:create]", err)
	}
	if err := userClient(t, carolCfg).Create(ctx, custom("by-carol")); err != nil {
		t.Errorf("a user with the update verb creating a lock with a spec of its own: %v", err)
	}
	if _, err := alice.TryAcquire(ctx, "by-carol"); err != nil {
		t.Fatal(err)
	}
	if _, err := bob.ForceRelease(ctx, "by-carol", "stuck"); err == nil || !strings.Contains(err.Error(), "[kubelock:force-release]") {
		t.Errorf("a lock user force-releasing: %v, want a denial tagged [kubelock:force-release]", err)
	}
	ended, err := carol.ForceRelease(ctx, "by-carol", "stuck")
	if err != nil || len(ended) != 1 || ended[0].EndedBy != "carol" {
		t.Errorf("a user with the force-release verb force-releasing: %v, ended %+v", err, ended)
	}
}

// grant gives user the verbs on distributedlocks in every namespace.
func grant(t *testing.T, user string, verbs ...string) {
	t.Helper()
	name := "lockapi-test-" + user
	for _, o := range []client.Object{
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{locksv1alpha1.GroupVersion.Group}, Resources: []string{"distributedlocks"}, Verbs: verbs}}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
			Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}}},
	} {
		if err := env.Client.Create(t.Context(), o); err != nil {
			t.Fatal(err)
		}
	}
}

func userClient(t *testing.T, cfg *rest.Config) client.Client {
	t.Helper()
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestStaleResourceVersionConflicts(t *testing.T) {
	ctx := t.Context()
	ns := namespace(t)
	l := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "stale"}}
	if err := env.Client.Create(ctx, l); err != nil {
		t.Fatal(err)
	}
	stale := l.DeepCopy()
	l.Labels = map[string]string{"edited": "once"}
	if err := env.Client.Update(ctx, l); err != nil {
		t.Fatal(err)
	}
	stale.Status.ObservedGeneration = 1
	if err := env.Client.Status().Update(ctx, stale); !apierrors.IsConflict(err) {
		t.Fatalf("a status write at resourceVersion %s after the lock moved to %s: %v, want 409 Conflict", stale.ResourceVersion, l.ResourceVersion, err)
	}
}

func TestEachEndpointWritesItsOwnPart(t *testing.T) {
	ctx := t.Context()
	ns := namespace(t)
	l := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "parts"}}
	if err := env.Client.Create(ctx, l); err != nil {
		t.Fatal(err)
	}
	// A status write that also edits spec and labels changes status alone.
	next := l.DeepCopy()
	next.Spec.MaxWaitSeconds = 60
	next.Labels = map[string]string{"via": "status"}
	next.Status.ObservedGeneration = l.Generation
	if err := env.Client.Status().Update(ctx, next); err != nil {
		t.Fatal(err)
	}
	got := get(t, ns, "parts")
	if got.Spec.MaxWaitSeconds != locksv1alpha1.DefaultMaxWaitSeconds || got.Labels != nil || got.Status.ObservedGeneration != l.Generation {
		t.Errorf("after a status write: spec.maxWaitSeconds %d, labels %v, status.observedGeneration %d", got.Spec.MaxWaitSeconds, got.Labels, got.Status.ObservedGeneration)
	}
	// A main-resource write that also edits status changes spec alone, and
	// counts the spec change in the generation.
	next = got.DeepCopy()
	next.Spec.MaxWaitSeconds = 60
	next.Status.ObservedGeneration = 7
	if err := env.Client.Update(ctx, next); err != nil {
		t.Fatal(err)
	}
	got = get(t, ns, "parts")
	if got.Spec.MaxWaitSeconds != 60 || got.Status.ObservedGeneration != l.Generation || got.Generation != l.Generation+1 {
		t.Errorf("after a spec write: spec.maxWaitSeconds %d, status.observedGeneration %d, generation %d", got.Spec.MaxWaitSeconds, got.Status.ObservedGeneration, got.Generation)
	}
}

// TestTimesGoWritesBackOutOfPatternAreRefused: a time that decodes but that
// Go writes back out of the CRD's patterns (year 0 at +01:00 is written as
// year -1) would leave a lock no Go client can read. A MicroTime is refused
// by the CRD's checks (422), as the CRD refuses it; a condition's
// lastTransitionTime, which the CRD takes as any date-time, by the rules'
// time-format denial (403). Neither write changes the lock.
func TestTimesGoWritesBackOutOfPatternAreRefused(t *testing.T) {
	ctx := t.Context()
	ns := namespace(t)
	alice, cfg, _ := lockClient(t, "alice", ns)
	held, err := alice.TryAcquire(ctx, "times")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = held.Release(ctx) }()
	c := userClient(t, cfg)
	for _, tc := range []struct {
		name   string
		set    func(status map[string]any)
		refuse func(error) bool
		want   string
	}{
		{"a holder's renewTime", func(s map[string]any) {
			s["holder"].(map[string]any)["renewTime"] = "0000-01-01T00:30:00.000000+01:00" //nolint:errcheck,forcetypeassert // a held lock's
		}, apierrors.IsInvalid, "status.holder.renewTime"},
		{"the Held condition's lastTransitionTime", func(s map[string]any) {
			s["conditions"].([]any)[0].(map[string]any)["lastTransitionTime"] = "0000-01-01T00:30:00+01:00" //nolint:errcheck,forcetypeassert // a held lock's
		}, apierrors.IsForbidden, "[kubelock:time-format]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(locksv1alpha1.GroupVersion.WithKind("DistributedLock"))
			if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "times"}, u); err != nil {
				t.Fatal(err)
			}
			before := u.GetResourceVersion()
			tc.set(u.Object["status"].(map[string]any)) //nolint:errcheck,forcetypeassert // a lock's status
			err := c.Status().Update(ctx, u)
			if !tc.refuse(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want a refusal naming %s", err, tc.want)
			}
			if after := get(t, ns, "times"); after.ResourceVersion != before {
				t.Errorf("the refused write changed the lock (resourceVersion %s → %s)", before, after.ResourceVersion)
			}
		})
	}
}

func TestHoldingInASession(t *testing.T) {
	ctx := t.Context()
	ns := namespace(t)
	c, _, _ := lockClient(t, "alice", ns)
	s, err := c.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.TryAcquire(ctx, "jobs", lock.WithSession(s))
	if err != nil {
		t.Fatal(err)
	}
	if h := get(t, ns, l.Name()).Status.Holder; h == nil || h.Session != s.Name() {
		t.Fatalf("the holding does not name session %s: %+v", s.Name(), h)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	err = env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: s.Name()}, &locksv1alpha1.LockSession{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("the closed session: %v, want it gone", err)
	}
}

func TestServerSideApply(t *testing.T) {
	ctx := t.Context()
	ns := namespace(t)
	apply := func(labels map[string]string) *locksv1alpha1.DistributedLock {
		t.Helper()
		l := &locksv1alpha1.DistributedLock{
			TypeMeta:   metav1.TypeMeta{APIVersion: locksv1alpha1.GroupVersion.String(), Kind: "DistributedLock"},
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "applied", Labels: labels},
			Spec:       locksv1alpha1.DistributedLockSpec{MaxWaitSeconds: 120},
		}
		if err := env.Client.Patch(ctx, l, client.Apply, client.FieldOwner("kubelock-test"), client.ForceOwnership); err != nil { //nolint:staticcheck // the typed apply configurations are not generated for this API
			t.Fatal(err)
		}
		return l
	}
	apply(map[string]string{"team": "shop", "tier": "gold"})
	// Applying without a label removes it: the apply knows what it owned.
	got := apply(map[string]string{"team": "shop"})
	if got.Labels["team"] != "shop" || got.Labels["tier"] != "" || got.Spec.MaxWaitSeconds != 120 {
		t.Errorf("after the second apply: labels %v, spec.maxWaitSeconds %d", got.Labels, got.Spec.MaxWaitSeconds)
	}
}

func TestPrinterColumnsAreTheCRDs(t *testing.T) {
	ctx := t.Context()
	ns := namespace(t)
	if err := env.Client.Create(ctx, &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "printed"}}); err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	table := &metav1.Table{}
	err = cs.CoreV1().RESTClient().Get().AbsPath("/apis", locksv1alpha1.GroupVersion.Group, locksv1alpha1.GroupVersion.Version, "namespaces", ns, "distributedlocks").
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").Do(ctx).Into(table)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range table.ColumnDefinitions {
		if c.Priority == 0 {
			names = append(names, c.Name)
		}
	}
	if want := []string{"Name", "Type", "Holders", "Holder", "Token", "Waiters", "Age"}; !slices.Equal(names, want) || len(table.Rows) != 1 {
		t.Errorf("columns %v and %d rows, want %v and one row", names, len(table.Rows), want)
	}
}

func get(t *testing.T, ns, name string) *locksv1alpha1.DistributedLock {
	t.Helper()
	l := &locksv1alpha1.DistributedLock{}
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, l); err != nil {
		t.Fatal(err)
	}
	return l
}

// requestLog records a client's requests.
type requestLog struct {
	mu   sync.Mutex
	seen []string
}

func (r *requestLog) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		r.mu.Lock()
		r.seen = append(r.seen, req.Method+" "+req.URL.Path)
		r.mu.Unlock()
		return rt.RoundTrip(req)
	})
}

func (r *requestLog) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = nil
}

// all are the requests so far.
func (r *requestLog) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.seen)
}

// lockRequests are the requests to the lock API.
func (r *requestLog) lockRequests() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, s := range r.seen {
		if strings.Contains(s, "/apis/"+locksv1alpha1.GroupVersion.Group+"/") {
			out = append(out, s)
		}
	}
	return out
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// TestLockWritesShareAccessReviews: kubelock-apiserver authorizes a request
// for one lock by the user's access to the namespace's locks
// (--authorize-by-namespace), so that a user's writes to many locks share the
// delegated authorizer's cached answers instead of costing kube-apiserver a
// SubjectAccessReview each; a user that RBAC limits to some names is still
// held to them.
func TestLockWritesShareAccessReviews(t *testing.T) {
	ctx := t.Context()
	ns := namespace(t)
	alice, _, _ := lockClient(t, "alice", ns)
	const locks = 40
	before := accessReviews(t)
	for i := range locks {
		l, err := alice.TryAcquire(ctx, fmt.Sprintf("lock-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Each kind of request asks once (the lock's create, get, and status
	// update); a few more if the cache's 10 s ran out during the loop.
	n := accessReviews(t) - before
	t.Logf("%d lock writes to %d locks: %d SubjectAccessReviews", 2*locks, locks, n)
	if n > 10 {
		t.Errorf("%d lock writes to %d locks made kube-apiserver answer %d SubjectAccessReviews, want one per kind of request", 2*locks, locks, n)
	}

	// dave may write the status of one lock only.
	for _, name := range []string{"orders", "billing"} {
		if err := env.Client.Create(ctx, &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, o := range []client.Object{
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "dave"}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{locksv1alpha1.GroupVersion.Group}, Resources: []string{"distributedlocks"}, Verbs: []string{"get"}},
			{APIGroups: []string{locksv1alpha1.GroupVersion.Group}, Resources: []string{"distributedlocks/status"}, Verbs: []string{"update"}, ResourceNames: []string{"orders"}},
		}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "dave"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "dave"},
			Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "dave"}}},
	} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	u, err := env.AddUser(envtest.User{Name: "dave"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	dave := userClient(t, u.Config())
	refusedByRBAC := func(err error) bool {
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), `cannot update resource "distributedlocks/status"`)
	}
	// RBAC's answer follows the new Role within moments, and the lock
	// apiserver keeps a denial 10 s.
	var orders error
	_ = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		orders = dave.Status().Update(ctx, get(t, ns, "orders"))
		return !refusedByRBAC(orders), nil
	})
	if refusedByRBAC(orders) {
		t.Errorf("dave's status write to orders, which his Role names: %v", orders)
	}
	billing := dave.Status().Update(ctx, get(t, ns, "billing"))
	if !refusedByRBAC(billing) {
		t.Errorf("dave's status write to billing, which his Role does not name: %v, want RBAC's 403", billing)
	}
}

// accessReviews is how many SubjectAccessReviews kube-apiserver has answered.
func accessReviews(t *testing.T) int {
	t.Helper()
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	body, err := cs.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, "apiserver_request_total{") || !strings.Contains(line, `resource="subjectaccessreviews"`) {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v); err != nil {
			t.Fatal(err)
		}
		n += int(v)
	}
	return n
}
