package operator

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	lockpkg "github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/testenv"
)

// operatorArgs, in a child process of this test binary, makes TestMain run
// the operator's Main with these newline-separated arguments instead of the tests.
const operatorArgs = "KUBELOCK_TEST_OPERATOR_ARGS"

func TestMain(m *testing.M) {
	if args := os.Getenv(operatorArgs); args != "" {
		os.Exit(Main(strings.Split(args, "\n"), os.Stderr))
	}
	os.Exit(m.Run())
}

func TestValidateElectionOptions(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(*Options)
		ok   bool
	}{
		{"lease by default", func(*Options) {}, true},
		{"kubelock with the default timings", func(o *Options) { o.LeaderElectionLock = ElectOnKubelock }, true},
		{"an unknown lock", func(o *Options) { o.LeaderElectionLock = "configmap" }, false},
		{"kubelock without a service account", func(o *Options) {
			o.LeaderElectionLock, o.LeaderElectionServiceAccount = ElectOnKubelock, ""
		}, false},
		// Lease tolerates these; kubelock's leader could outlive its holding.
		{"kubelock with a renew deadline close to the lease", func(o *Options) {
			o.LeaderElectionLock, o.LeaseDuration, o.RenewDeadline = ElectOnKubelock, 12*time.Second, 10*time.Second
		}, false},
		{"kubelock with a lease of a fraction of a second", func(o *Options) {
			o.LeaderElectionLock, o.LeaseDuration = ElectOnKubelock, 15500*time.Millisecond
		}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := DefaultOptions()
			c.edit(&o)
			if err := o.Validate(); (err == nil) != c.ok {
				t.Errorf("Validate() = %v, want ok %v", err, c.ok)
			}
		})
	}
}

// TestElectOnKubelock runs two operators, each a process of its own as in a
// Deployment, electing on a DistributedLock behind the admission webhook with
// no other controller running. Each runs as the chart runs it: in a Pod of
// the manager's service account, with POD_NAME and POD_UID set (envtest has
// no kubelet, but the apiserver knows the Pod objects). The leader is killed:
// only the standby can end its holding (the controller runs on the leader),
// and then it leads. A third replica, whose campaign cannot get a token,
// says so in its metrics; the standby, which waits in the queue, does not.
func TestElectOnKubelock(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane")
	}
	env, err := testenv.Start(testenv.WithWebhook())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	const operator = "kubelock-operator"
	must(t, env.StartWebhook(ctx, operator))
	opCfg, err := env.ControllerConfig(operator)
	must(t, err)
	kubeconfig := writeKubeconfig(t, opCfg)

	// The service account the replicas campaign as, a lock user in the
	// operator's namespace, as config/rbac's leader_election_candidate.yaml;
	// and the one their pods run as, as config/manager's Deployment.
	const ns, sa, podSA = "default", "kubelock-leader-election", "kubelock-controller-manager"
	for _, name := range []string{sa, podSA} {
		must(t, env.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}))
	}
	must(t, env.Client.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: testenv.LockUserRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: sa}},
	}))

	opts := DefaultOptions()
	key := client.ObjectKey{Namespace: ns, Name: opts.LeaderElectionID}
	start := func(name string, extra ...string) (*exec.Cmd, string) {
		t.Helper()
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec:       corev1.PodSpec{ServiceAccountName: podSA, Containers: []corev1.Container{{Name: "manager", Image: "kubelock/manager"}}},
		}
		must(t, env.Client.Create(ctx, pod))
		metrics := freeAddr(t)
		args := append([]string{
			"--kubeconfig=" + kubeconfig, "--leader-election-lock=kubelock", "--leader-election-namespace=" + ns,
			"--leader-election-lease-duration=6s", "--leader-election-renew-deadline=3s", "--leader-election-retry-period=1s",
			"--expiry-grace=500ms", "--enable-webhook=false", "--metrics-bind-address=" + metrics, "--metrics-secure=false",
			"--health-probe-bind-address=0",
		}, extra...)
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), operatorArgs+"="+strings.Join(args, "\n"), "POD_NAME="+pod.Name, "POD_UID="+string(pod.UID))
		logFile, err := os.Create(filepath.Join(t.TempDir(), name+".log"))
		must(t, err)
		cmd.Stdout, cmd.Stderr = logFile, logFile
		must(t, cmd.Start())
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			if t.Failed() {
				out, _ := os.ReadFile(logFile.Name())
				t.Logf("log of %s:\n%s", name, out)
			}
		})
		return cmd, "http://" + metrics + "/metrics"
	}
	lock := &locksv1alpha1.DistributedLock{}
	poll := func(what string, cond func() bool) {
		t.Helper()
		err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
			if err := env.Client.Get(ctx, key, lock); err != nil {
				return false, nil //nolint:nilerr // not created yet: keep polling
			}
			return cond(), nil
		})
		if err != nil {
			t.Fatalf("waiting for %s: %v; lock status: %+v", what, err, lock.Status)
		}
	}
	holder := func(identity string) func() bool {
		return func() bool { h := lock.Status.Holder; return h != nil && h.Identity == identity }
	}
	campaignFailing := func(url, want string) {
		t.Helper()
		const gauge = "kubelock_manager_leader_election_campaign_failing "
		var body string
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			_, body = get(url)
			return strings.Contains(body, gauge+want+"\n"), nil
		})
		if err != nil {
			t.Fatalf("%s: want %s%s; metrics:\n%.3000s", url, gauge, want, body)
		}
	}

	a, _ := start("op-a")
	poll("op-a to lead", holder("op-a"))
	first := *lock.Status.Holder
	tokenA := lock.Status.FencingToken
	if want := "system:serviceaccount:" + ns + ":" + sa; first.User != want {
		t.Errorf("the leader holds the lock as %q, want the election's service account %q", first.User, want)
	}
	// Its token is bound to no pod, so its holding names none.
	if first.PodName != "" || first.PodUID != "" {
		t.Errorf("the leader's holding names pod %q (%q), want none: its token is not bound to a pod", first.PodName, first.PodUID)
	}
	_, bMetrics := start("op-b")
	poll("op-b to queue", func() bool { return len(lock.Status.Waiters) == 1 && lock.Status.Waiters[0].Identity == "op-b" })
	campaignFailing(bMetrics, "0")
	_, cMetrics := start("op-c", "--leader-election-service-account=missing")
	campaignFailing(cMetrics, "1")

	must(t, a.Process.Signal(syscall.SIGKILL))
	poll("op-b to lead", holder("op-b"))
	if lock.Status.FencingToken <= tokenA {
		t.Errorf("op-b leads with token %d, not above op-a's %d", lock.Status.FencingToken, tokenA)
	}
	ended := lock.Status.RecentAcquisitions[len(lock.Status.RecentAcquisitions)-1]
	if ended.LeaseID != first.LeaseID || ended.EndReason != locksv1alpha1.EndReasonExpired || ended.EndedBy != operator {
		t.Errorf("op-a's holding ended as %+v, want Expired by %s (op-b's standby controller)", ended, operator)
	}

	// The new leader runs the controller: it expires a lapsed holding.
	userCfg, err := env.UserConfig(ctx, "alice")
	must(t, err)
	alice, err := lockpkg.New(userCfg, lockpkg.WithNamespace(ns), lockpkg.WithoutAutoRenew(), lockpkg.WithAutoCreate())
	must(t, err)
	held, err := alice.TryAcquire(ctx, "lapses", lockpkg.WithLeaseDuration(time.Second))
	must(t, err)
	select {
	case <-held.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("alice's unrenewed holding did not end")
	}
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := alice.Get(ctx, "lapses")
		if err != nil || len(l.Status.RecentAcquisitions) == 0 {
			return false, nil //nolint:nilerr // keep polling
		}
		f := l.Status.RecentAcquisitions[0]
		return f.EndReason == locksv1alpha1.EndReasonExpired && f.EndedBy == operator, nil
	})
	if err != nil {
		t.Fatalf("the new leader does not expire locks: %v", err)
	}
}

// writeKubeconfig writes cfg's server and credentials to a kubeconfig file.
func writeKubeconfig(t *testing.T, cfg *rest.Config) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	kc.CurrentContext = "c"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	must(t, clientcmd.WriteToFile(*kc, path))
	return path
}
