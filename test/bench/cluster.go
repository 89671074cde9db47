package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kubelock/kubelock/internal/pki"
	childproc "github.com/kubelock/kubelock/internal/proc"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/test/testenv"
	kwebhook "github.com/kubelock/kubelock/webhook"
)

const (
	// controllerUser is the operator's user name (a client certificate in
	// system:masters); the webhook learns it, the policy gets it patched in.
	controllerUser = "kubelock-bench-controller"
	// benchUser is every lock client's user, bound to the lock-user role.
	benchUser = "kubelock-bench-user"
	// lockNS holds the seed-mix locks; workNS the other workloads' objects.
	lockNS  = "bench"
	leaseNS = "bench-leases"
	workNS  = "bench-work"
	// leaderElectionID is the operator's own leader Lease in namespace default.
	leaderElectionID = "kubelock-manager.locks.kubelock.io"
	policyName       = "kubelock-distributedlocks"
	webhookCfgName   = "kubelock-validating-webhook-configuration"
)

// engine is the admission engine in front of lock writes.
type engine string

const (
	engineWebhook engine = "webhook"
	enginePolicy  engine = "policy"
	engineNone    engine = "none"
)

// cluster is everything the benchmark runs against: testenv's etcd and
// kube-apiserver, the operator binary as a child process serving the webhook
// with a certificate from our own CA, and a redis-server.
type cluster struct {
	dir     string
	env     *testenv.Env
	admin   *rest.Config
	adminCS kubernetes.Interface
	user    *rest.Config // benchUser, no client-side rate limit
	etcdURL string

	mgr      *childproc.Child
	mgrMu    sync.Mutex // c.mgr, once the scale workload restarts it
	mgrArgs  []string   // the operator's binary and flags
	restarts int
	// heapProfiles counts the operator's heap profiles taken.
	heapProfiles int
	mgrMetrics   string // http://127.0.0.1:port/metrics
	mgrPprof     string // http://127.0.0.1:port/debug/pprof
	webhookCfg   *admissionregistrationv1.ValidatingWebhookConfiguration
	vap          *admissionregistrationv1.ValidatingAdmissionPolicy
	vapBinding   *admissionregistrationv1.ValidatingAdmissionPolicyBinding
	redis        *childproc.Child
	redisAddr    string
	probeSerial  int
	logf         func(string, ...any)
	metaVap      *admissionregistrationv1.ValidatingAdmissionPolicy // the main resource's policy (create, delete)
	metaBinding  *admissionregistrationv1.ValidatingAdmissionPolicyBinding
	// sessionVap is the LockSession policy ([kubelock:session]), the
	// policy engine's counterpart of the webhook's vlocksession.
	sessionVap     *admissionregistrationv1.ValidatingAdmissionPolicy
	sessionBinding *admissionregistrationv1.ValidatingAdmissionPolicyBinding
}

// cborGate is the apiserver's CBOR feature gate (KEP-4222; alpha in 1.37,
// off by default): CBOR request and response bodies for every resource, and
// CBOR as the storage encoding of custom resources.
const cborGate = "CBORServingAndStorage"

// startCluster starts the control plane (with cborGate on when cbor is
// set), the operator and, when withRedis is set, redis.
func startCluster(ctx context.Context, dir string, logf func(string, ...any), cbor, withRedis bool) (c *cluster, err error) {
	c = &cluster{dir: dir, logf: logf}
	defer func() {
		if err != nil {
			c.stop()
		}
	}()
	var opts []testenv.Option
	if cbor {
		opts = append(opts, testenv.WithAPIServerArgs("feature-gates", cborGate+"=true"))
	}
	logf("control plane: etcd + kube-apiserver from %s (feature gates: %s)", testenv.AssetsDir(), map[bool]string{true: cborGate + "=true", false: "defaults"}[cbor])
	env, err := testenv.Start(opts...)
	if err != nil {
		return c, err
	}
	if err := c.connect(ctx, env); err != nil {
		return c, err
	}
	c.etcdURL = c.env.Cluster.Etcd.Members[0].ClientURL
	// The lock-user role has no Lease verbs; the baselines' user may write Leases.
	role, binding := leaseRBAC()
	if err := c.env.Client.Create(ctx, role); err != nil {
		return c, err
	}
	if err := c.env.Client.Create(ctx, binding); err != nil {
		return c, err
	}
	if err := c.startManager(ctx); err != nil {
		return c, err
	}
	if withRedis {
		if err := c.startRedis(ctx); err != nil {
			return c, err
		}
	}
	return c, nil
}

// connect makes env the cluster's control plane: the administrator's and
// benchUser's connections (no client-side rate limit) and the workloads'
// namespaces.
func (c *cluster) connect(ctx context.Context, env *testenv.Env) error {
	c.env = env
	c.admin = rest.CopyConfig(env.Config)
	c.admin.QPS, c.admin.Burst = -1, 0
	var err error
	if c.adminCS, err = kubernetes.NewForConfig(c.admin); err != nil {
		return err
	}
	if c.user, err = env.UserConfig(ctx, benchUser); err != nil {
		return err
	}
	c.user.QPS = -1
	for _, ns := range []string{lockNS, leaseNS, workNS} {
		if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			return err
		}
	}
	return nil
}

func (c *cluster) stop() {
	if c.redis != nil {
		_ = c.redis.Stop(5 * time.Second)
	}
	_ = c.stopManager()
	if c.env != nil {
		_ = c.env.Stop()
	}
}

// --- the operator ------------------------------------------------------------

// stopManager stops the operator, if it runs.
func (c *cluster) stopManager() error {
	c.mgrMu.Lock()
	m := c.mgr
	c.mgr = nil
	c.mgrMu.Unlock()
	if m == nil {
		return nil
	}
	return m.Stop(10 * time.Second)
}

// startManager builds ./cmd/manager, issues the webhook's serving certificate
// from a fresh CA, and runs the binary as production does: leader election on,
// the webhook served (the certificate from files: --cert-rotation=false).
// It returns once the operator leads.
func (c *cluster) startManager(ctx context.Context) error {
	if err := c.launchManager(ctx); err != nil {
		return err
	}
	return c.mgr.WaitFor(ctx, "leader", 90*time.Second, func(ctx context.Context) error {
		l, err := c.adminCS.CoordinationV1().Leases("default").Get(ctx, leaderElectionID, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
			return errors.New("no leader yet")
		}
		return nil
	})
}

// otherReplica holds the leader Lease when the operator must not lead.
const otherReplica = "kubelock-bench-other-replica"

// startStandbyManager runs the operator as startManager does, as a replica
// that never leads: another holds the leader Lease for an hour. It serves
// the webhook, as every replica does, and its controller never starts
// (that is the leader's), so its CPU is the webhook's.
func (c *cluster) startStandbyManager(ctx context.Context) error {
	id, hour, now := otherReplica, int32(3600), metav1.NowMicro()
	if _, err := c.adminCS.CoordinationV1().Leases("default").Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: leaderElectionID},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &id, LeaseDurationSeconds: &hour, AcquireTime: &now, RenewTime: &now},
	}, metav1.CreateOptions{}); err != nil {
		return err
	}
	return c.launchManager(ctx)
}

// launchManager builds and starts the operator with its credentials, and
// waits until it is ready.
func (c *cluster) launchManager(ctx context.Context) error {
	c.logf("building ./cmd/manager")
	bin, err := testenv.Build(ctx, c.dir, "./cmd/manager")
	if err != nil {
		return err
	}
	kubeconfig, err := c.managerKubeconfig()
	if err != nil {
		return err
	}
	certDir := filepath.Join(c.dir, "webhook-certs")
	caPEM, err := writeServingCert(certDir)
	if err != nil {
		return err
	}
	ports, err := childproc.FreePorts(4)
	if err != nil {
		return err
	}
	webhookPort, metricsPort, probePort, pprofPort := ports[0], ports[1], ports[2], ports[3]
	c.mgrMetrics = fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort)
	c.mgrPprof = fmt.Sprintf("http://127.0.0.1:%d/debug/pprof", pprofPort)
	if err := c.loadAdmission(caPEM, webhookPort); err != nil {
		return err
	}
	c.mgrArgs = []string{bin,
		"--kubeconfig=" + kubeconfig,
		"--leader-elect=true",
		"--leader-election-namespace=default",
		"--leader-election-id=" + leaderElectionID,
		"--cert-rotation=false",
		"--webhook-cert-dir=" + certDir,
		"--webhook-host=127.0.0.1",
		"--webhook-port=" + strconv.Itoa(webhookPort),
		fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", metricsPort),
		"--metrics-secure=false", // scraped over plain HTTP on loopback
		fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", probePort),
		fmt.Sprintf("--pprof-bind-address=127.0.0.1:%d", pprofPort),
	}
	if c.mgr, err = childproc.Start("manager", bin, filepath.Join(c.dir, "manager.log"), c.mgrArgs[1:]...); err != nil {
		return err
	}
	c.logf("operator: pid %d, webhook https://127.0.0.1:%d, log %s", c.mgr.Pid(), webhookPort, c.mgr.LogPath)
	readyz := fmt.Sprintf("http://127.0.0.1:%d/readyz", probePort)
	return c.mgr.WaitFor(ctx, "ready", 90*time.Second, func(ctx context.Context) error {
		return httpOK(ctx, readyz)
	})
}

// managerKubeconfig writes the operator's kubeconfig: controllerUser, in
// system:masters.
func (c *cluster) managerKubeconfig() (string, error) {
	u, err := c.env.AddUser(envtest.User{Name: controllerUser, Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return "", err
	}
	kc, err := u.KubeConfig()
	if err != nil {
		return "", err
	}
	path := filepath.Join(c.dir, "manager.kubeconfig")
	return path, os.WriteFile(path, kc, 0o600)
}

// loadAdmission reads the webhook configuration from config/webhook (url
// clientConfig to the operator's port, our CA) and the three policies of
// config/policy, lock status, metadata and sessions (the controller's user
// patched in), as a cluster using either engine would load them.
func (c *cluster) loadAdmission(caPEM []byte, port int) error {
	root := testenv.RepoRoot()
	c.webhookCfg = &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := readYAML(filepath.Join(root, "config", "webhook", "manifests.yaml"), c.webhookCfg); err != nil {
		return err
	}
	c.webhookCfg.Name = webhookCfgName
	for i := range c.webhookCfg.Webhooks {
		w := &c.webhookCfg.Webhooks[i]
		path := kwebhook.Path
		if w.ClientConfig.Service != nil && w.ClientConfig.Service.Path != nil {
			path = *w.ClientConfig.Service.Path
		}
		url := fmt.Sprintf("https://127.0.0.1:%d%s", port, path)
		w.ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: caPEM}
	}
	var err error
	if c.vap, c.vapBinding, err = readPolicy("validating_admission_policy.yaml", true); err != nil {
		return err
	}
	if c.metaVap, c.metaBinding, err = readPolicy("metadata_validating_admission_policy.yaml", false); err != nil {
		return err
	}
	c.sessionVap, c.sessionBinding, err = readPolicy("session_validating_admission_policy.yaml", true)
	return err
}

// readPolicy reads a policy of config/policy and its binding (the file
// name with _binding), with the controller's user patched into its first
// variable when it has that variable.
func readPolicy(file string, hasControllerUser bool) (*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding, error) {
	dir := filepath.Join(testenv.RepoRoot(), "config", "policy")
	vap := &admissionregistrationv1.ValidatingAdmissionPolicy{}
	if err := readYAML(filepath.Join(dir, file), vap); err != nil {
		return nil, nil, err
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
	if err := readYAML(filepath.Join(dir, strings.TrimSuffix(file, ".yaml")+"_binding.yaml"), binding); err != nil {
		return nil, nil, err
	}
	if hasControllerUser {
		if len(vap.Spec.Variables) == 0 || vap.Spec.Variables[0].Name != "controllerUser" {
			return nil, nil, fmt.Errorf("config/policy/%s: the first variable is not controllerUser", file)
		}
		vap.Spec.Variables[0].Expression = fmt.Sprintf("'%s'", controllerUser)
	}
	return vap, binding, nil
}

// policies are the policy engine's objects, each policy before its binding.
func (c *cluster) policies() []client.Object {
	return []client.Object{c.vap.DeepCopy(), c.vapBinding.DeepCopy(), c.metaVap.DeepCopy(), c.metaBinding.DeepCopy(), c.sessionVap.DeepCopy(), c.sessionBinding.DeepCopy()}
}

// activate installs exactly one admission engine (or none) and waits until
// the apiserver enforces it and, when the webhook is off, stops calling it.
func (c *cluster) activate(ctx context.Context, e engine) error {
	if err := c.operatorAlive(); err != nil {
		return err
	}
	cl := c.env.Client
	if e == engineWebhook {
		w := c.webhookCfg.DeepCopy()
		if err := cl.Create(ctx, w); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	} else if err := client.IgnoreNotFound(cl.Delete(ctx, c.webhookCfg.DeepCopy())); err != nil {
		return err
	}
	if e == enginePolicy {
		for _, o := range c.policies() {
			if err := cl.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
				return err
			}
		}
	} else {
		// Bindings first, so no policy is left bound to nothing.
		ps := c.policies()
		slices.Reverse(ps)
		for _, o := range ps {
			if err := client.IgnoreNotFound(cl.Delete(ctx, o)); err != nil {
				return err
			}
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		got, err := c.probe(ctx)
		if err != nil {
			return err
		}
		if got == e {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("admission engine %s not in force after 60s (probe says %s)", e, got)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if e == engineWebhook {
		return nil
	}
	// The policy answers before webhooks; wait until an admitted write no longer
	// reaches the webhook at all.
	for {
		before, err := c.webhookDecisions(ctx)
		if err != nil {
			return err
		}
		l, err := c.probeLock(ctx)
		if err != nil {
			return err
		}
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			if err := cl.Get(ctx, client.ObjectKeyFromObject(l), l); err != nil {
				return err
			}
			l.Status.ObservedGeneration++
			return cl.Status().Update(ctx, l)
		}); err != nil {
			return err
		}
		after, err := c.webhookDecisions(ctx)
		if err != nil {
			return err
		}
		if after == before {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("the apiserver still calls the webhook 60s after its configuration was deleted")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// operatorAlive fails when the operator process has exited (it exits when it
// loses leader election, as in production where its pod would restart).
func (c *cluster) operatorAlive() error {
	select {
	case <-c.mgr.Done():
		return fmt.Errorf("the operator exited: %w", c.mgr.Exited())
	default:
		return nil
	}
}

func (c *cluster) probeLock(ctx context.Context) (*locksv1alpha1.DistributedLock, error) {
	c.probeSerial++
	l := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: workNS, Name: fmt.Sprintf("probe-%d", c.probeSerial)}}
	return l, c.env.Client.Create(ctx, l)
}

// probe writes a holder in someone else's name and reports who denied it.
func (c *cluster) probe(ctx context.Context) (engine, error) {
	l, err := c.probeLock(ctx)
	if err != nil {
		return "", err
	}
	err = writeForeignHolder(ctx, c.env.Client, l)
	switch {
	case err == nil:
		return engineNone, nil
	case strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+policyName+"'"):
		return enginePolicy, nil
	case strings.Contains(err.Error(), `admission webhook "vdistributedlock`):
		return engineWebhook, nil
	}
	return engine("unexpected: " + err.Error()), nil
}

// writeForeignHolder writes l's status as acquired in someone else's name:
// a write every admission engine denies.
func writeForeignHolder(ctx context.Context, cl client.Client, l *locksv1alpha1.DistributedLock) error {
	tok, err := locksv1alpha1.NextFencingToken(l.ResourceVersion)
	if err != nil {
		return err
	}
	now := metav1.NowMicro()
	l.Acquire(locksv1alpha1.LockHolder{Identity: "probe", User: "somebody-else", LeaseID: "probe-lease-000000000000",
		RequestID: "probe-request", LeaseDurationSeconds: 30, AcquireTime: now, RenewTime: &now}, tok)
	return cl.Status().Update(ctx, l)
}

// webhookDecisions is the operator's count of admission decisions.
func (c *cluster) webhookDecisions(ctx context.Context) (float64, error) {
	body, err := httpGet(ctx, c.mgrMetrics)
	if err != nil {
		return 0, err
	}
	return sumMetric(body, "kubelock_webhook_admission_decisions_total", nil), nil
}

// --- redis -------------------------------------------------------------------

func (c *cluster) startRedis(ctx context.Context) error {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return errors.New("redis-server not found: run hack/install-redis.sh")
	}
	ports, err := childproc.FreePorts(1)
	if err != nil {
		return err
	}
	c.redisAddr = fmt.Sprintf("127.0.0.1:%d", ports[0])
	c.redis, err = childproc.Start("redis-server", bin, filepath.Join(c.dir, "redis.log"),
		"--bind", "127.0.0.1", "--port", strconv.Itoa(ports[0]), "--save", "", "--appendonly", "no",
		"--dir", c.dir, "--protected-mode", "yes")
	if err != nil {
		return err
	}
	return c.redis.WaitFor(ctx, "answering", 30*time.Second, func(ctx context.Context) error {
		conn, err := net.DialTimeout("tcp", c.redisAddr, time.Second)
		if err != nil {
			return err
		}
		defer func() { _ = conn.Close() }()
		_ = conn.SetDeadline(time.Now().Add(time.Second))
		if _, err := conn.Write([]byte("PING\r\n")); err != nil {
			return err
		}
		line, err := bufio.NewReader(conn).ReadString('\n')
		if err != nil {
			return err
		}
		if !strings.HasPrefix(line, "+PONG") {
			return fmt.Errorf("redis answered %q", line)
		}
		return nil
	})
}

// --- apiserver metrics and profiles ----------------------------------------------

// writeCounts is apiserver_request_total of mutating verbs by "VERB
// resource[/subresource]".
type writeCounts map[string]float64

func (w writeCounts) total() float64 {
	var t float64
	for _, v := range w {
		t += v
	}
	return t
}

func (c *cluster) apiserverWrites(ctx context.Context) (writeCounts, error) {
	body, err := c.adminCS.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	w := writeCounts{}
	sumMetric(body, "apiserver_request_total", func(l map[string]string, v float64) {
		switch l["verb"] {
		case "POST", "PUT", "PATCH", "DELETE", "APPLY", "DELETECOLLECTION":
		default:
			return
		}
		k := l["verb"] + " " + l["resource"]
		if l["subresource"] != "" {
			k += "/" + l["subresource"]
		}
		w[k] += v
	})
	return w, nil
}

// of sums the writes of the given resources, any verb and subresource.
func (w writeCounts) of(resources ...string) float64 {
	var t float64
	for k, v := range w {
		_, res, _ := strings.Cut(k, " ")
		res, _, _ = strings.Cut(res, "/")
		if slices.Contains(resources, res) {
			t += v
		}
	}
	return t
}

// since is the per-second rate of each key between two counts.
func (w writeCounts) since(before writeCounts, secs float64) writeCounts {
	out := writeCounts{}
	for k, v := range w {
		if d := v - before[k]; d > 0 {
			out[k] = d / secs
		}
	}
	return out
}

// apiserverProfile takes a CPU profile of kube-apiserver for d.
func (c *cluster) apiserverProfile(ctx context.Context, d time.Duration, path string) error {
	body, err := c.adminCS.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").
		Param("seconds", strconv.Itoa(int(d.Seconds()))).Timeout(d + 30*time.Second).DoRaw(ctx)
	if err != nil {
		return err
	}
	return os.WriteFile(path, body, 0o644)
}

// managerProfile takes a CPU profile of the operator for d.
func (c *cluster) managerProfile(ctx context.Context, d time.Duration, path string) error {
	body, err := httpGet(ctx, fmt.Sprintf("%s/profile?seconds=%d", c.mgrPprof, int(d.Seconds())))
	if err != nil {
		return err
	}
	return os.WriteFile(path, body, 0o644)
}

// sumMetric calls each with the labels and value of every sample of a
// Prometheus text-format metric and returns their sum.
func sumMetric(body []byte, name string, each func(labels map[string]string, v float64)) float64 {
	var sum float64
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		labels := map[string]string{}
		switch {
		case strings.HasPrefix(rest, "{"):
			end := strings.LastIndex(rest, "}")
			if end < 0 {
				continue
			}
			for _, kv := range splitLabels(rest[1:end]) {
				k, v, ok := strings.Cut(kv, "=")
				if ok {
					labels[k] = strings.Trim(v, `"`)
				}
			}
			rest = rest[end+1:]
		case strings.HasPrefix(rest, " "):
		default:
			continue // a longer name with the same prefix
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		if each != nil {
			each(labels, v)
		}
		sum += v
	}
	return sum
}

// splitLabels splits `a="x",b="y,z"` at the commas outside quotes.
func splitLabels(s string) []string {
	var out []string
	inQ, start := false, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			inQ = !inQ
		case ',':
			if !inQ {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

// --- helpers -----------------------------------------------------------------

// leaseRBAC lets benchUser use coordination.k8s.io Leases and the bare CRD
// (the baselines).
func leaseRBAC() (*rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding) {
	const name = "kubelock-bench-leases"
	return &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{coordinationv1.GroupName}, Resources: []string{"leases"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
				{APIGroups: []string{bareGVR.Group}, Resources: []string{bareGVR.Resource}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
			},
		}, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: benchUser}},
		}
}

func readYAML(path string, into any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := yaml.UnmarshalStrict(b, into); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// writeServingCert creates a CA and a serving certificate for 127.0.0.1 and
// localhost signed by it, writes tls.crt and tls.key to dir, and returns the
// CA certificate (the webhook configuration's caBundle).
func writeServingCert(dir string) ([]byte, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	ca, err := pki.New("kubelock-bench-ca")
	if err != nil {
		return nil, err
	}
	crtPEM, keyPEM, err := ca.Serving("kubelock-webhook")
	if err != nil {
		return nil, err
	}
	return ca.PEM, errors.Join(os.WriteFile(filepath.Join(dir, "tls.crt"), crtPEM, 0o600), os.WriteFile(filepath.Join(dir, "tls.key"), keyPEM, 0o600))
}

func httpGet(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(resp.Body); err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return buf.Bytes(), nil
}

func httpOK(ctx context.Context, url string) error {
	_, err := httpGet(ctx, url)
	return err
}
