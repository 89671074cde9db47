package operator

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	sigsyaml "sigs.k8s.io/yaml"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/rules"
	"github.com/kubelock/kubelock/test/testenv"
	"github.com/kubelock/kubelock/webhook"
)

func TestValidateWebhookOptions(t *testing.T) {
	o := DefaultOptions()
	if err := o.Validate(); err != nil {
		t.Fatalf("defaults are invalid: %v", err)
	}
	o.EnableWebhook, o.CertSecretName, o.WebhookPort = false, "", 0
	if err := o.Validate(); err != nil {
		t.Errorf("webhook settings are checked although --enable-webhook=false: %v", err)
	}
	o = DefaultOptions()
	o.CertRotation, o.CertSecretName = false, ""
	if err := o.Validate(); err != nil {
		t.Errorf("rotation settings are checked although --cert-rotation=false: %v", err)
	}
}

func TestListFlag(t *testing.T) {
	o := DefaultOptions()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	o.BindFlags(fs)
	if err := fs.Parse([]string{"--webhook-controller-users= a ,,b", "--cert-extra-dns-names=localhost"}); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(o.WebhookControllerUsers, "|"); got != "a|b" {
		t.Errorf("--webhook-controller-users parsed as %q", got)
	}
	if got := strings.Join(o.webhookDNSNames(), "|"); got != "kubelock-webhook-service.kubelock-system.svc|kubelock-webhook-service.kubelock-system.svc.cluster.local|kubelock-webhook-service.kubelock-system|localhost" {
		t.Errorf("DNS names %q", got)
	}
}

// TestWebhookServesWithSelfRotatedCertificate runs the operator as the binary
// does, with the webhook and self-rotation on, against a real control plane and
// the webhook configuration generated into config/webhook: the manager issues
// its certificate into the (empty) Secret, injects the caBundle, becomes ready,
// and its own webhook then enforces the lock rules for the apiserver: another
// user's release is denied, the holder's allowed. After the Secret is wiped it
// issues a new CA and keeps serving; its own expiry passes its own webhook.
func TestWebhookServesWithSelfRotatedCertificate(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane")
	}
	if inOwnProcess(t) {
		return
	}
	start := time.Now()
	env := startLogged(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	opts := DefaultOptions()
	opts.MetricsAddr = "0"
	opts.ProbeAddr = freeAddr(t)
	opts.LeaderElectionNamespace = "default"
	_, port, _ := net.SplitHostPort(freeAddr(t))
	opts.WebhookPort, _ = strconv.Atoi(port)
	opts.WebhookCertDir = filepath.Join(t.TempDir(), "serving-certs") // like the emptyDir: absent at first
	// The apiserver calls https://localhost:<port>; in a cluster it calls the Service.
	opts.CertExtraDNSNames = []string{"localhost"}
	opts.ExpiryGrace = 200 * time.Millisecond
	// The test apiserver presents a client certificate to webhooks (testenv's
	// AdmissionConfiguration); the webhook requires it.
	opts.WebhookClientCAFile = env.WebhookClientCAFile

	// What config/webhook ships: the namespace, the empty Secret and the
	// generated webhook configuration (here pointing at this process).
	must(t, env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: opts.CertSecretNamespace}}))
	must(t, env.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: opts.CertSecretNamespace, Name: opts.CertSecretName}}))
	vwc := webhookConfiguration(t, filepath.Join("config", "webhook", "manifests.yaml"), opts.WebhookPort)
	vwc.Name = opts.WebhookConfigName
	must(t, env.Client.Create(ctx, vwc))
	// The optional fenced-objects webhook gets its caBundle from the same rotation.
	fenced := webhookConfiguration(t, filepath.Join("config", "fenced-objects", "webhook.yaml"), opts.WebhookPort)
	fenced.Annotations = nil // no cert-manager here
	if fenced.Name != opts.FencedWebhookConfigName {
		t.Fatalf("config/fenced-objects names its webhook configuration %q, the manager's default is %q", fenced.Name, opts.FencedWebhookConfigName)
	}
	must(t, env.Client.Create(ctx, fenced))

	// The controller's own user: the webhook must learn it (SelfSubjectReview)
	// without --webhook-controller-users. It has exactly the permissions
	// config/rbac grants (resourceNames included), not an administrator's.
	const controllerUser = "kubelock-test-controller"
	ctrlCfg := managerUserConfig(ctx, t, env, controllerUser, opts.CertSecretNamespace, opts.LeaderElectionNamespace)
	var runErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		runErr = Run(ctx, ctrlCfg, opts)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		if runErr != nil {
			t.Errorf("Run: %v", runErr)
		}
	})

	poll := func(what string, timeout time.Duration, cond func(context.Context) (bool, error)) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, timeout, true, cond); err != nil {
			select {
			case <-done:
				t.Fatalf("waiting for %s: the manager stopped: %v", what, runErr)
			default:
			}
			t.Fatalf("waiting for %s: %v", what, err)
		}
	}
	// caBundle is the bundle every webhook of both configurations carries, or
	// nil while they differ.
	caBundle := func(ctx context.Context) []byte {
		var bundle []byte
		for _, key := range []client.ObjectKey{{Name: vwc.Name}, {Name: fenced.Name}} {
			var got admissionregistrationv1.ValidatingWebhookConfiguration
			if err := env.Client.Get(ctx, key, &got); err != nil || len(got.Webhooks) == 0 {
				return nil
			}
			for _, w := range got.Webhooks {
				if len(w.ClientConfig.CABundle) == 0 || bundle != nil && string(bundle) != string(w.ClientConfig.CABundle) {
					return nil
				}
				bundle = w.ClientConfig.CABundle
			}
		}
		return bundle
	}
	var ca []byte
	poll("the caBundle to be injected into both webhook configurations", 60*time.Second, func(ctx context.Context) (bool, error) {
		ca = caBundle(ctx)
		return len(ca) > 0, nil
	})
	var readyz string
	poll("/readyz with the webhook checks", 60*time.Second, func(context.Context) (bool, error) {
		code, body := get(fmt.Sprintf("http://%s/readyz?verbose", opts.ProbeAddr))
		readyz = body
		return code == http.StatusOK, nil
	})
	for _, check := range []string{"[+]webhook ok", "[+]webhook-ca-injected ok"} {
		if !strings.Contains(readyz, check) {
			t.Errorf("/readyz does not include %q:\n%s", check, readyz)
		}
	}
	checkServingCert(t, opts, ca)
	checkWebhookRefusesStrangers(t, opts, ca)
	t.Logf("webhook ready with a self-issued certificate %s after the test began (control-plane start included)", time.Since(start).Round(time.Millisecond))

	alice, bob := userClient(ctx, t, env, "alice"), userClient(ctx, t, env, "bob")
	l := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "guarded"}}
	must(t, env.Client.Create(ctx, l))
	// The first write through the webhook may race the apiserver picking up
	// the new caBundle; retry only until the webhook answers at all.
	poll("alice to acquire through the webhook", 30*time.Second, func(ctx context.Context) (bool, error) {
		if err := alice.Get(ctx, client.ObjectKeyFromObject(l), l); err != nil {
			return false, err
		}
		token, err := locksv1alpha1.NextFencingToken(l.ResourceVersion)
		if err != nil {
			return false, err
		}
		l.Acquire(holder("alice"), token)
		l.Status.ObservedGeneration = l.Generation // as pkg/lock writes it, so the controller has nothing to add
		err = alice.Status().Update(ctx, l)
		if apierrors.IsConflict(err) || err != nil && strings.Contains(err.Error(), "failed calling webhook") {
			return false, nil // the controller wrote first, or the caBundle is not picked up yet
		}
		return err == nil, err
	})

	// bob releases alice's lock: denied by the manager's webhook.
	hostile := l.DeepCopy()
	hostile.EndHolding(locksv1alpha1.EndReasonReleased, "bob", metav1.NewMicroTime(time.Now()))
	err := bob.Status().Update(ctx, hostile)
	if err == nil || !strings.Contains(err.Error(), "[kubelock:holder-only]") || !strings.Contains(err.Error(), `admission webhook "vdistributedlock.kubelock.io" denied`) {
		t.Fatalf("bob's release of alice's lock: got %v, want a denial by the webhook naming [kubelock:holder-only]", err)
	}
	// alice releases her own: allowed.
	l.EndHolding(locksv1alpha1.EndReasonReleased, "alice", metav1.NewMicroTime(time.Now()))
	must(t, alice.Status().Update(ctx, l))
	if l.Status.Holder != nil || len(l.Status.RecentAcquisitions) != 1 {
		t.Fatalf("after alice's release: %+v", l.Status)
	}

	// Rotation: wipe the Secret. The manager issues a new CA and serving pair,
	// injects the new caBundle, rewrites its files and keeps enforcing.
	var sec corev1.Secret
	must(t, env.Client.Get(ctx, client.ObjectKey{Namespace: opts.CertSecretNamespace, Name: opts.CertSecretName}, &sec))
	oldCrt, oldBundle := sec.Data["tls.crt"], ca
	sec.Data = nil
	must(t, env.Client.Update(ctx, &sec))
	poll("a new caBundle after the Secret was wiped", 60*time.Second, func(ctx context.Context) (bool, error) {
		ca = caBundle(ctx)
		return len(ca) > 0 && string(ca) != string(oldBundle), nil
	})
	poll("the new serving certificate on disk", 30*time.Second, func(context.Context) (bool, error) {
		crt, err := os.ReadFile(filepath.Join(opts.WebhookCertDir, "tls.crt"))
		return err == nil && string(crt) != string(oldCrt), nil
	})
	checkServingCert(t, opts, ca)
	poll("bob to be denied again, now through the rotated certificate", 60*time.Second, func(ctx context.Context) (bool, error) {
		if err := bob.Get(ctx, client.ObjectKeyFromObject(l), l); err != nil {
			return false, err
		}
		token, err := locksv1alpha1.NextFencingToken(l.ResourceVersion)
		if err != nil {
			return false, err
		}
		forged := l.DeepCopy()
		h := holder("alice") // bob writes a holder in alice's name
		h.RequestID = "req-forged"
		forged.Acquire(h, token)
		err = bob.Status().Update(ctx, forged)
		return err != nil && strings.Contains(err.Error(), "[kubelock:identity]"), nil
	})

	// The controller expires through the same webhook: its own user name,
	// learned at start, is a controller user there.
	poll("alice to acquire a one-second lease", 30*time.Second, func(ctx context.Context) (bool, error) {
		if err := alice.Get(ctx, client.ObjectKeyFromObject(l), l); err != nil {
			return false, err
		}
		token, err := locksv1alpha1.NextFencingToken(l.ResourceVersion)
		if err != nil {
			return false, err
		}
		h := holder("alice")
		// A fresh leaseID: alice held the lock before (lease-id rule).
		h.LeaseID, h.RequestID, h.LeaseDurationSeconds = "lease-0123456789-short", "req-short", 1
		l.Acquire(h, token)
		err = alice.Status().Update(ctx, l)
		if apierrors.IsConflict(err) {
			return false, nil
		}
		return err == nil, err
	})
	poll("the controller to expire the lease", 30*time.Second, func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(l), l); err != nil {
			return false, err
		}
		f := l.Status.FindFinished("req-short")
		return f != nil && f.EndReason == locksv1alpha1.EndReasonExpired && f.EndedBy == controllerUser, nil
	})

	// The manager also serves the fenced-objects path: an update of a fenced
	// ConfigMap without a token is denied.
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Namespace: "default", Name: "fenced", Labels: map[string]string{"locks.kubelock.io/fenced": "true"},
		Annotations: map[string]string{locksv1alpha1.FencedByAnnotation: l.Name, locksv1alpha1.FencingTokenAnnotation: strconv.FormatInt(l.Status.FencingToken, 10)},
	}}
	must(t, env.Client.Create(ctx, cm)) // the admin may force-release, and brings the lock's current token
	delete(cm.Annotations, locksv1alpha1.FencingTokenAnnotation)
	cm.Data = map[string]string{"k": "v"}
	if err := env.Client.Update(ctx, cm); err == nil || !strings.Contains(err.Error(), "[kubelock:"+string(rules.RuleStaleToken)+"]") {
		t.Fatalf("an untokened update of a fenced ConfigMap: got %v, want a [kubelock:%s] denial", err, rules.RuleStaleToken)
	}
}

// managerUserConfig is a connection as user, bound to what config/rbac grants
// the operator: the generated ClusterRole and Role (role.yaml, with
// resourceNames) and the leader-election Role, in the given namespaces.
func managerUserConfig(ctx context.Context, t *testing.T, env *testenv.Env, user, operatorNS, leaderNS string) *rest.Config {
	t.Helper()
	u, err := env.AddUser(envtest.User{Name: user}, nil)
	must(t, err)
	subject := []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}}
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "rbac", "role.yaml"))
	must(t, err)
	for _, doc := range strings.Split(string(data), "\n---\n") {
		var meta metav1.TypeMeta
		must(t, sigsyaml.Unmarshal([]byte(doc), &meta))
		switch meta.Kind {
		case "ClusterRole":
			var role rbacv1.ClusterRole
			must(t, sigsyaml.Unmarshal([]byte(doc), &role))
			must(t, env.Client.Create(ctx, &role))
			must(t, env.Client.Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role.Name}, Subjects: subject,
				RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name}}))
		case "Role":
			var role rbacv1.Role
			must(t, sigsyaml.Unmarshal([]byte(doc), &role))
			bindRole(ctx, t, env, &role, operatorNS, subject)
		}
	}
	var election rbacv1.Role
	readManifest(t, filepath.Join("config", "rbac", "leader_election_role.yaml"), &election)
	bindRole(ctx, t, env, &election, leaderNS, subject)
	return u.Config()
}

func bindRole(ctx context.Context, t *testing.T, env *testenv.Env, role *rbacv1.Role, ns string, subject []rbacv1.Subject) {
	t.Helper()
	role.Namespace = ns
	must(t, env.Client.Create(ctx, role))
	must(t, env.Client.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: role.Name}, Subjects: subject,
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name}}))
}

// checkWebhookRefusesStrangers posts an AdmissionReview to the webhook as
// anyone but the apiserver: over plain HTTP, over TLS without a client
// certificate, and with a certificate of another CA. None gets an answer from
// the webhook: the handshake fails (or Go's fixed plain-HTTP 400).
func checkWebhookRefusesStrangers(t *testing.T, o Options, caBundle []byte) {
	t.Helper()
	review := `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1","kind":{"group":"locks.kubelock.io","version":"v1alpha1","kind":"DistributedLock"},"resource":{"group":"locks.kubelock.io","version":"v1alpha1","resource":"distributedlocks"},"subResource":"status","namespace":"default","name":"guarded","operation":"UPDATE","userInfo":{"username":"mallory"},"object":{},"oldObject":{}}}`
	path := fmt.Sprintf("localhost:%d%s", o.WebhookPort, webhook.Path)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caBundle)
	stranger := selfSignedClientCert(t)
	for _, c := range []struct {
		name   string
		scheme string
		cert   *tls.Certificate
	}{{"plain HTTP", "http", nil}, {"TLS without a client certificate", "https", nil}, {"a client certificate of another CA", "https", &stranger}} {
		cfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
		if c.cert != nil {
			// Sent whatever CAs the server asks for.
			cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return c.cert, nil }
		}
		hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
		resp, err := hc.Post(c.scheme+"://"+path, "application/json", strings.NewReader(review)) //nolint:noctx // a local test endpoint
		if err != nil {
			t.Logf("%s: refused: %v", c.name, err)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if c.scheme == "https" || resp.StatusCode != http.StatusBadRequest || strings.Contains(string(body), "response") {
			t.Errorf("%s: the webhook answered %d %q", c.name, resp.StatusCode, body)
		}
	}
}

// selfSignedClientCert is a client certificate no cluster CA signed.
func selfSignedClientCert(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: testenv.WebhookClientCN},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	must(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// checkServingCert verifies the files the webhook serves chain to caBundle and
// name the Service.
func checkServingCert(t *testing.T, o Options, caBundle []byte) {
	t.Helper()
	crtPEM, err := os.ReadFile(filepath.Join(o.WebhookCertDir, "tls.crt"))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(crtPEM)
	if block == nil {
		t.Fatalf("tls.crt is no PEM certificate")
	}
	crt, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caBundle) {
		t.Fatalf("the caBundle holds no certificate")
	}
	for _, name := range []string{"kubelock-webhook-service.kubelock-system.svc", "localhost"} {
		if _, err := crt.Verify(x509.VerifyOptions{DNSName: name, Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("the serving certificate does not verify for %s against the caBundle: %v", name, err)
		}
	}
}

// webhookConfiguration reads the ValidatingWebhookConfiguration in file (under
// the repository root), checks that it fails closed without side effects, and
// points every webhook at https://localhost:port with its path.
func webhookConfiguration(t *testing.T, file string, port int) *admissionregistrationv1.ValidatingWebhookConfiguration {
	t.Helper()
	f, err := os.Open(filepath.Join(testenv.RepoRoot(), file))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	var vwc admissionregistrationv1.ValidatingWebhookConfiguration
	if err := yaml.NewYAMLOrJSONDecoder(f, 4096).Decode(&vwc); err != nil {
		t.Fatal(err)
	}
	if vwc.Kind != "ValidatingWebhookConfiguration" || len(vwc.Webhooks) == 0 {
		t.Fatalf("%s: want a ValidatingWebhookConfiguration with webhooks, got %s with %d", file, vwc.Kind, len(vwc.Webhooks))
	}
	for i, w := range vwc.Webhooks {
		if w.FailurePolicy == nil || *w.FailurePolicy != admissionregistrationv1.Fail ||
			w.SideEffects == nil || *w.SideEffects != admissionregistrationv1.SideEffectClassNone {
			t.Errorf("%s: webhook %s: want failurePolicy Fail and sideEffects None", file, w.Name)
		}
		path := webhook.Path
		if s := w.ClientConfig.Service; s != nil && s.Path != nil {
			path = *s.Path
		}
		vwc.Webhooks[i].ClientConfig = admissionregistrationv1.WebhookClientConfig{
			URL: ptr.To(fmt.Sprintf("https://localhost:%d%s", port, path)),
		}
	}
	return &vwc
}

func holder(user string) locksv1alpha1.LockHolder {
	now := metav1.NewMicroTime(time.Now().Truncate(time.Microsecond))
	return locksv1alpha1.LockHolder{
		Identity:             user + "-worker",
		User:                 user,
		LeaseID:              "lease-0123456789-" + user,
		RequestID:            "req-" + user,
		LeaseDurationSeconds: 30,
		AcquireTime:          now,
		RenewTime:            &now,
	}
}

func userClient(ctx context.Context, t *testing.T, env *testenv.Env, name string) client.Client {
	t.Helper()
	cfg, err := env.UserConfig(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func get(url string) (int, string) {
	resp, err := http.Get(url) //nolint:gosec,noctx // a local test endpoint
	if err != nil {
		return 0, err.Error()
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestWebhookServesUntilDrained: the webhook server keeps serving after the
// manager stopped it, until Drain. controller-runtime stops webhooks before it
// releases the leader election, and the release's own admission request may be
// sent to this replica while it is still among the Service's endpoints.
func TestWebhookServesUntilDrained(t *testing.T) {
	dir := t.TempDir()
	crt, key, err := certutil.GenerateSelfSignedCertKey("localhost", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{certName: crt, keyName: key} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	addr := freeAddr(t)
	host, port, _ := net.SplitHostPort(addr)
	o := DefaultOptions()
	o.WebhookHost, o.WebhookCertDir = host, dir
	if o.WebhookPort, err = strconv.Atoi(port); err != nil {
		t.Fatal(err)
	}
	srv, err := newWebhookServer(o)
	if err != nil {
		t.Fatal(err)
	}
	handshake := func() error {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // a handshake is all this checks
		if err != nil {
			return err
		}
		return conn.Close()
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	returned := make(chan error, 1)
	go func() { returned <- srv.Start(ctx) }()
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return handshake() == nil, nil
	}); err != nil {
		t.Fatalf("the webhook server never served: %v", handshake())
	}

	cancel() // the manager stops its runnables
	select {
	case err := <-returned:
		if err != nil {
			t.Fatalf("Start returned %v when its context ended, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Start did not return when its context ended: the manager's stop would wait for it")
	}
	if err := handshake(); err != nil {
		t.Fatalf("after the manager's stop, before Drain: %v; want the server still serving", err)
	}

	srv.Drain()
	if err := handshake(); err == nil {
		t.Fatal("after Drain the server still completes handshakes")
	}
}
