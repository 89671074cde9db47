// Package admission is the hostile-input suite of kubelock's admission: one
// table of malformed and malicious lock writes that runs against a real
// kube-apiserver with the validating webhook (webhook/, served by this
// process), then with the ValidatingAdmissionPolicy (config/policy) instead,
// and against kubelock-apiserver, which runs the same rules in-process on a
// control plane of its own (lockapi_test.go), so the engines can never
// drift apart.
package admission

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	"sigs.k8s.io/yaml"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/test/suite"
	"github.com/kubelock/kubelock/test/testenv"
	kwebhook "github.com/kubelock/kubelock/webhook"
)

const (
	// controllerUser is the test's controller account; the policy's default
	// name is replaced by it, as an overlay would.
	controllerUser = "kubelock-test-controller"
	// defaultControllerExpr is the policy's controllerUser variable as shipped.
	defaultControllerExpr = "'system:serviceaccount:kubelock-system:kubelock-controller-manager'"
	policyName            = "kubelock-distributedlocks"
	metaPolicyName        = policyName + "-metadata"
	breakglassRole        = "kubelock-breakglass"
	deleterRole           = "kubelock-test-lock-deleter"
	editorRole            = "kubelock-test-lock-editor"           // what an attacker with the sample lock-user RBAC has: all but force-release
	webhookDenied         = `admission webhook "vdistributedlock` // .kubelock.io (status) or -meta.kubelock.io
	// policyDenied names either policy: kubelock-distributedlocks (status) or
	// kubelock-distributedlocks-metadata (create, update, delete).
	policyDenied = "ValidatingAdmissionPolicy '" + policyName
	// lockAPIDenied is how the lock apiserver's rules deny: a 403 of the
	// resource whose message lists the rules' field errors, each a
	// "<path>: Forbidden: [kubelock:<rule>] ...".
	lockAPIDenied = "Forbidden: [kubelock:"
	// podSA is a service account whose bound token names its pod (impersonated).
	podSA = "system:serviceaccount:apps:worker"
)

// user is an authenticated lock client.
type user struct {
	name string
	c    client.Client
	cfg  *rest.Config
}

var (
	env *testenv.Env
	// raw reads objects as the apiserver serialises them, for byte comparisons.
	raw kubernetes.Interface
	// webhookConfigs are the ValidatingWebhookConfigurations envtest installed
	// (URL and CA of this process's server), kept to install them again.
	webhookConfigs []*admissionregistrationv1.ValidatingWebhookConfiguration
	// webhookRequests counts admission requests the webhook server received.
	webhookRequests atomic.Int64
	stopWebhook     func()

	alice, bob, carol, dave, ctlr, breakglass, deleter, podUser *user
	// mallory is a lock user who was also given the editor role; lockadmin has
	// only the editor role's verbs (an administrator of locks); operator has
	// the editor and the break-glass roles.
	mallory, lockadmin, operator *user

	lockCounter atomic.Int64
)

func TestAdmission(t *testing.T) {
	suite.Run(t, "admission hostile-input suite", 30*time.Second, 50*time.Millisecond)
}

var _ = BeforeSuite(func(ctx SpecContext) {
	manifests := filepath.Join(testenv.RepoRoot(), "config", "webhook")
	var err error
	env, err = testenv.Start(func(e *envtest.Environment) {
		e.WebhookInstallOptions = envtest.WebhookInstallOptions{Paths: []string{manifests}}
	})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() { Expect(env.Stop()).To(Succeed()) })
	for _, w := range env.WebhookInstallOptions.ValidatingWebhooks {
		webhookConfigs = append(webhookConfigs, w.DeepCopy())
	}
	Expect(webhookConfigs).To(HaveLen(1), "config/webhook/manifests.yaml (make manifests) holds one ValidatingWebhookConfiguration")
	setUpUsers(ctx)

	stopWebhook = startWebhookServer()
	DeferCleanup(func() { stopWebhook() })
})

// setUpUsers makes the suite's users and roles in env's control plane.
func setUpUsers(ctx context.Context) {
	admin := rest.CopyConfig(env.Config)
	admin.QPS = -1
	var err error
	raw, err = kubernetes.NewForConfig(admin)
	Expect(err).NotTo(HaveOccurred())

	alice, bob, carol, dave = newUser(ctx, "alice"), newUser(ctx, "bob"), newUser(ctx, "carol"), newUser(ctx, "dave")
	ctlr = newUser(ctx, controllerUser)

	// The break-glass role exactly as config/rbac ships it.
	role := &rbacv1.ClusterRole{}
	readYAML(filepath.Join(testenv.RepoRoot(), "config", "rbac", "breakglass_role.yaml"), role)
	Expect(role.Name).To(Equal(breakglassRole))
	Expect(env.Client.Create(ctx, role)).To(Succeed())
	breakglass = newUser(ctx, "breakglass")
	bindClusterRole(ctx, breakglassRole, rbacv1.UserKind, "breakglass")

	// deleter may delete locks but has no force-release verb.
	Expect(env.Client.Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: deleterRole},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{locksv1alpha1.GroupVersion.Group},
			Resources: []string{"distributedlocks"}, Verbs: []string{"get", "delete"}}},
	})).To(Succeed())
	deleter = newUser(ctx, "deleter")
	bindClusterRole(ctx, deleterRole, rbacv1.UserKind, "deleter")

	Expect(env.Client.Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: editorRole},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{locksv1alpha1.GroupVersion.Group}, Resources: []string{"distributedlocks"},
			Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}}},
	})).To(Succeed())
	mallory, lockadmin, operator = newUser(ctx, "mallory"), newUser(ctx, "lockadmin"), newUser(ctx, "operator")
	for _, u := range []*user{mallory, lockadmin, operator} {
		bindClusterRole(ctx, editorRole, rbacv1.UserKind, u.name)
	}
	bindClusterRole(ctx, breakglassRole, rbacv1.UserKind, operator.name)

	// A pod's service account: its bound token carries the pod's name and UID.
	bindClusterRole(ctx, testenv.LockUserRole, rbacv1.UserKind, podSA)
	podUser = impersonatedPod(pod0Name, pod0UID)
	otherPodUser = sync.OnceValue(func() *user { return impersonatedPod(pod1Name, pod1UID) })
	badPodUser = sync.OnceValue(func() *user { return impersonatedPod(badPodName, badPodUID) })
	unboundPodUser = sync.OnceValue(func() *user { return impersonatedPod("", "") })
}

func newClient(cfg *rest.Config) client.Client {
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	Expect(err).NotTo(HaveOccurred())
	return c
}

// newUser is a client-certificate user bound to the lock-user role, with no
// client-side rate limit.
func newUser(ctx context.Context, name string) *user {
	cfg, err := env.UserConfig(ctx, name)
	Expect(err).NotTo(HaveOccurred())
	cfg.QPS = -1
	return &user{name: name, c: newClient(cfg), cfg: cfg}
}

func bindClusterRole(ctx context.Context, role, kind, name string) {
	Expect(env.Client.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role + "-" + strings.NewReplacer(":", "-").Replace(name)},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: kind, Name: name}},
	})).To(Succeed())
}

func readYAML(path string, into any) {
	b, err := os.ReadFile(path)
	Expect(err).NotTo(HaveOccurred())
	Expect(yaml.UnmarshalStrict(b, into)).To(Succeed(), path)
}

// startWebhookServer serves the lock validator where envtest's webhook
// configuration points, and returns a function that stops it.
func startWebhookServer() func() {
	o := env.WebhookInstallOptions
	srv := crwebhook.NewServer(crwebhook.Options{Host: o.LocalServingHost, Port: o.LocalServingPort, CertDir: o.LocalServingCertDir})
	v, err := kwebhook.NewValidator(env.Scheme, env.Client, controllerUser)
	Expect(err).NotTo(HaveOccurred())
	hook := &admission.Webhook{Handler: v}
	srv.Register(kwebhook.Path, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		webhookRequests.Add(1)
		hook.ServeHTTP(w, r)
	}))
	srv.Register(kwebhook.SessionPath, &admission.Webhook{Handler: v.Sessions()})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer GinkgoRecover()
		defer close(done)
		Expect(srv.Start(ctx)).To(Succeed())
	}()
	Eventually(func() error { return srv.StartedChecker()(nil) }).Should(Succeed())
	return func() { cancel(); <-done }
}

// --- engines -------------------------------------------------------------------

type engine string

const (
	engineWebhook engine = "webhook"
	enginePolicy  engine = "policy"
	engineNone    engine = "none"
	// engineLockAPI is kubelock-apiserver, which runs the rules in its
	// registry strategies. It serves the lock API in a control plane of its
	// own (no lock CRDs), where it is always on.
	engineLockAPI engine = "lockapi"
)

// crdEngines take turns on the CRD control plane of BeforeSuite.
var crdEngines = []engine{engineWebhook, enginePolicy}

// activate installs exactly one admission engine (or none) and waits until the
// apiserver enforces it. The lock apiserver cannot be switched: activate
// checks that it is the one that denies.
func activate(ctx context.Context, e engine) {
	if e == engineLockAPI {
		ns := namespace(ctx, "probe")
		Expect(probe(ctx, ns)).To(Equal(e))
		Expect(probeMeta(ctx, ns)).To(Equal(e))
		Expect(probeSession(ctx, ns)).To(Equal(e))
		return
	}
	if e == engineWebhook {
		for _, w := range webhookConfigs {
			w = w.DeepCopy()
			w.ResourceVersion = ""
			if err := env.Client.Create(ctx, w); !apierrors.IsAlreadyExists(err) {
				Expect(err).NotTo(HaveOccurred())
			}
		}
	} else {
		for _, w := range webhookConfigs {
			Expect(client.IgnoreNotFound(env.Client.Delete(ctx, w.DeepCopy()))).To(Succeed())
		}
	}
	objs := policyObjects()
	if e == enginePolicy {
		for _, o := range objs {
			if err := env.Client.Create(ctx, o); !apierrors.IsAlreadyExists(err) {
				Expect(err).NotTo(HaveOccurred())
			}
		}
	} else {
		for _, o := range slices.Backward(objs) {
			Expect(client.IgnoreNotFound(env.Client.Delete(ctx, o))).To(Succeed())
		}
	}
	ns := namespace(ctx, "probe")
	// A forged holder: denied by whichever engine is on, stored when none is.
	Eventually(func() engine { return probe(ctx, ns) }).Should(Equal(e))
	// The main resource's rules: the second policy, or the second webhook.
	Eventually(func() engine { return probeMeta(ctx, ns) }).Should(Equal(e))
	// The session rules: the third policy, or the session webhook.
	Eventually(func() engine { return probeSession(ctx, ns) }).Should(Equal(e))
	if e != engineWebhook {
		// The policy runs before webhooks, so also wait until the apiserver
		// stops calling the webhook at all.
		l := createLock(ctx, ns, locksv1alpha1.DistributedLockSpec{})
		Eventually(func(g Gomega) {
			before := webhookRequests.Load()
			g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(l), l)).To(Succeed())
			// A write admission sees (a lock user may set observedGeneration
			// only to metadata.generation; an unchanged write is still admitted).
			l.Status.ObservedGeneration = l.Generation
			g.Expect(env.Client.Status().Update(ctx, l)).To(Succeed())
			g.Expect(webhookRequests.Load() - before).To(BeZero())
		}).Should(Succeed())
	}
}

// policyObjects reads config/policy (both policies, each before its binding)
// and puts the test's controller user in.
func policyObjects() []client.Object {
	dir := filepath.Join(testenv.RepoRoot(), "config", "policy")
	vap := &admissionregistrationv1.ValidatingAdmissionPolicy{}
	readYAML(filepath.Join(dir, "validating_admission_policy.yaml"), vap)
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
	readYAML(filepath.Join(dir, "validating_admission_policy_binding.yaml"), binding)
	Expect(vap.Spec.Variables[0].Name).To(Equal("controllerUser"))
	Expect(vap.Spec.Variables[0].Expression).To(Equal(defaultControllerExpr))
	vap.Spec.Variables[0].Expression = fmt.Sprintf("'%s'", controllerUser)
	Expect(binding.Spec.PolicyName).To(Equal(vap.Name))
	Expect(vap.Name).To(Equal(policyName))

	meta := &admissionregistrationv1.ValidatingAdmissionPolicy{}
	readYAML(filepath.Join(dir, "metadata_validating_admission_policy.yaml"), meta)
	metaBinding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
	readYAML(filepath.Join(dir, "metadata_validating_admission_policy_binding.yaml"), metaBinding)
	Expect(meta.Name).To(Equal(metaPolicyName))
	Expect(metaBinding.Spec.PolicyName).To(Equal(meta.Name))
	return append([]client.Object{vap, binding, meta, metaBinding}, sessionPolicyObjects()...)
}

// probe writes a holder in someone else's name and reports who denied it.
func probe(ctx context.Context, ns string) engine {
	l := createLock(ctx, ns, locksv1alpha1.DistributedLockSpec{})
	tok, err := locksv1alpha1.NextFencingToken(l.ResourceVersion)
	Expect(err).NotTo(HaveOccurred())
	l.Acquire(holder("somebody-else", 1), tok)
	return denier(env.Client.Status().Update(ctx, l))
}

// probeMeta creates (dry run) a lock with a forged force-delete annotation
// as a lock user and reports who denied it.
func probeMeta(ctx context.Context, ns string) engine {
	l := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{
		Namespace: ns, Name: fmt.Sprintf("probe-%d", lockCounter.Add(1)),
		Annotations: map[string]string{locksv1alpha1.ForceDeleteAnnotation: "true"},
	}}
	return denier(alice.c.Create(ctx, l, client.DryRunAll))
}

// denier says which engine denied a write that every engine denies.
func denier(err error) engine {
	switch {
	case err == nil:
		return engineNone
	case strings.Contains(err.Error(), policyDenied):
		return enginePolicy
	case strings.Contains(err.Error(), webhookDenied):
		return engineWebhook
	case strings.Contains(err.Error(), sessionPolicyDenied):
		return enginePolicy
	case strings.Contains(err.Error(), sessionWebhookDenied):
		return engineWebhook
	case strings.Contains(err.Error(), lockAPIDenied):
		return engineLockAPI
	}
	return engine("error: " + err.Error())
}

// --- locks ---------------------------------------------------------------------

func namespace(ctx context.Context, prefix string) string {
	n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}
	Expect(env.Client.Create(ctx, n)).To(Succeed())
	return n.Name
}

func createLock(ctx context.Context, ns string, spec locksv1alpha1.DistributedLockSpec) *locksv1alpha1.DistributedLock {
	l := &locksv1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("lock-%d", lockCounter.Add(1))},
		Spec:       spec,
	}
	Expect(env.Client.Create(ctx, l)).To(Succeed())
	return l
}

// leaseID is a well-formed lease ID for user's n-th holding.
func leaseID(user string, n int) string {
	return fmt.Sprintf("lease-%s-%012d", strings.NewReplacer(":", "-").Replace(user), n)
}

func requestID(user string, n int) string {
	return fmt.Sprintf("req-%s-%d", strings.NewReplacer(":", "-").Replace(user), n)
}

// holder is a holding written in user's name.
func holder(user string, n int) locksv1alpha1.LockHolder {
	now := metav1.NowMicro()
	return locksv1alpha1.LockHolder{
		Identity: strings.NewReplacer(":", "-").Replace(user), User: user,
		LeaseID: leaseID(user, n), RequestID: requestID(user, n),
		LeaseDurationSeconds: 30, AcquireTime: now, RenewTime: &now,
	}
}

func waiter(user string, n int) locksv1alpha1.Waiter {
	now := metav1.NowMicro()
	return locksv1alpha1.Waiter{
		Identity: user, User: user, RequestID: requestID(user, n),
		EnqueueTime: now, Deadline: metav1.NewMicroTime(now.Add(time.Minute)),
	}
}

// write reads the lock as u, changes it with fn and writes the status back.
func write(ctx context.Context, u *user, key client.ObjectKey, fn func(*locksv1alpha1.DistributedLock)) error {
	l := &locksv1alpha1.DistributedLock{}
	if err := u.c.Get(ctx, key, l); err != nil {
		return err
	}
	fn(l)
	return u.c.Status().Update(ctx, l)
}

// acquire makes h the holder with the right token.
func acquire(h locksv1alpha1.LockHolder) func(*locksv1alpha1.DistributedLock) {
	return func(l *locksv1alpha1.DistributedLock) {
		tok, err := locksv1alpha1.NextFencingToken(l.ResourceVersion)
		Expect(err).NotTo(HaveOccurred())
		l.Acquire(h, tok)
	}
}

func renew(l *locksv1alpha1.DistributedLock) {
	t := metav1.NewMicroTime(l.Status.Holder.RenewTime.Add(time.Second))
	l.Status.Holder.RenewTime = &t
}

func end(reason locksv1alpha1.EndReason, by string) func(*locksv1alpha1.DistributedLock) {
	return func(l *locksv1alpha1.DistributedLock) { l.EndHolding(reason, by, metav1.NowMicro()) }
}

func enqueue(w locksv1alpha1.Waiter) func(*locksv1alpha1.DistributedLock) {
	return func(l *locksv1alpha1.DistributedLock) { l.Status.AppendWaiter(w) }
}

// state is a lock to start a case from, built with allowed writes by its users.
type state struct {
	spec locksv1alpha1.DistributedLockSpec
	// history: alice held the lock once (holding number 0) and released it.
	history bool
	// holder names the user that holds the lock (holding number 1).
	holder string
	// readers name the users that hold the lock shared, on slots 0, 1, …
	// (holding number 1 each; an RWMutex's readers, a Semaphore's permits).
	readers []string
	// waiters name the users queueing in this order (request number 1 each),
	// in the lock's default mode; shared(user) queues user as a reader.
	waiters []string
	// annotations and finalizers are set by the administrator.
	annotations map[string]string
	finalizers  []string
}

// build creates the lock in ns and brings it into state s.
func (s state) build(ctx context.Context, ns string) client.ObjectKey {
	l := &locksv1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: fmt.Sprintf("lock-%d", lockCounter.Add(1)),
			Annotations: s.annotations, Finalizers: s.finalizers,
		},
		Spec: s.spec,
	}
	Expect(env.Client.Create(ctx, l)).To(Succeed())
	key := client.ObjectKeyFromObject(l)
	if s.history {
		Expect(write(ctx, alice, key, acquire(holder(alice.name, 0)))).To(Succeed())
		Expect(write(ctx, alice, key, end(locksv1alpha1.EndReasonReleased, alice.name))).To(Succeed())
	}
	if s.holder != "" {
		Expect(write(ctx, who(s.holder), key, acquire(holder(s.holder, 1)))).To(Succeed())
	}
	for i, r := range s.readers {
		Expect(write(ctx, who(r), key, acquireShared(holder(r, 1), int32(i)))).To(Succeed())
	}
	for _, w := range s.waiters {
		name, mode := w, l.DefaultMode()
		if u, ok := strings.CutSuffix(w, sharedSuffix); ok {
			name, mode = u, locksv1alpha1.Shared
		}
		ww := waiter(name, 1)
		ww.Mode = mode
		Expect(write(ctx, who(name), key, enqueue(ww))).To(Succeed())
	}
	return key
}

// sharedSuffix marks a state's waiter that queues Shared.
const sharedSuffix = "/shared"

// shared names user as a waiter that queues Shared (a reader).
func shared(user string) string { return user + sharedSuffix }

// acquireShared adds h as a shared holding on slot with the right token.
func acquireShared(h locksv1alpha1.LockHolder, slot int32) func(*locksv1alpha1.DistributedLock) {
	return func(l *locksv1alpha1.DistributedLock) {
		tok, err := locksv1alpha1.NextFencingToken(l.ResourceVersion)
		Expect(err).NotTo(HaveOccurred())
		l.AcquireShared(h, slot, tok)
	}
}

// endShared ends user's shared holding number n as by, for reason.
func endShared(user string, n int, reason locksv1alpha1.EndReason, by string) func(*locksv1alpha1.DistributedLock) {
	return func(l *locksv1alpha1.DistributedLock) {
		Expect(l.EndShared(leaseID(user, n), reason, by, metav1.NowMicro())).To(BeTrue(), "no shared holding %s", leaseID(user, n))
	}
}

// renewShared advances the renewTime of user's shared holding number n.
func renewShared(user string, n int) func(*locksv1alpha1.DistributedLock) {
	return func(l *locksv1alpha1.DistributedLock) {
		i := l.Status.SharedIndex(leaseID(user, n))
		Expect(i).NotTo(BeNumerically("<", 0), "no shared holding %s", leaseID(user, n))
		h := &l.Status.SharedHolders[i]
		t := metav1.NewMicroTime(h.RenewTime.Add(time.Second))
		h.RenewTime = &t
	}
}

// who is the user called name; table entries name users because they are
// built before BeforeSuite creates them.
func who(name string) *user {
	for _, u := range []*user{alice, bob, carol, dave, ctlr, breakglass, deleter, podUser, mallory, lockadmin, operator} {
		if u.name == name {
			return u
		}
	}
	Fail("no user " + name)
	return nil
}

func get(ctx context.Context, key client.ObjectKey) *locksv1alpha1.DistributedLock {
	l := &locksv1alpha1.DistributedLock{}
	Expect(env.Client.Get(ctx, key, l)).To(Succeed())
	return l
}

// getRaw is the lock exactly as the apiserver serves it.
func getRaw(ctx context.Context, key client.ObjectKey) []byte {
	b, err := raw.CoreV1().RESTClient().Get().
		AbsPath("/apis", locksv1alpha1.GroupVersion.Group, locksv1alpha1.GroupVersion.Version,
			"namespaces", key.Namespace, "distributedlocks", key.Name).
		DoRaw(ctx)
	Expect(err).NotTo(HaveOccurred())
	return b
}

// isDenial reports whether err is an admission or validation rejection rather
// than, say, a conflict.
func isDenial(err error) bool {
	var s apierrors.APIStatus
	if !errors.As(err, &s) {
		return false
	}
	switch s.Status().Code {
	case http.StatusForbidden, http.StatusUnprocessableEntity:
		return true
	}
	return false
}

func int32p(v int32) *int32 { return &v }
