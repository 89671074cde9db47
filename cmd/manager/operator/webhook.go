package operator

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/renameio/v2"
	"github.com/open-policy-agent/cert-controller/pkg/rotator"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/kubelock/kubelock/controllers"
	"github.com/kubelock/kubelock/webhook"
)

// The self-rotating certificate needs the Secret it keeps the CA and the
// serving pair in (created empty by config/webhook; only in the operator's
// namespace) and the webhook configuration whose caBundle it keeps current.
//
// (The rotator's cache lists and watches the namespace's Secrets; it reads and
// writes only --cert-secret-name, config/webhook's kubelock-webhook-server-cert.)
//
// +kubebuilder:rbac:groups="",namespace=system,resources=secrets,verbs=list;watch
// +kubebuilder:rbac:groups="",namespace=system,resources=secrets,resourceNames=kubelock-webhook-server-cert,verbs=get;update
//
// The rotator's informer lists and watches webhook configurations cluster-wide
// (RBAC cannot restrict list/watch by name without a field selector), but it
// reads and writes only the two it is configured with: config/default's names,
// --webhook-config-name and --fenced-webhook-config-name (an overlay that
// renames them must also patch the ClusterRole's resourceNames).
//
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingwebhookconfigurations,verbs=list;watch
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingwebhookconfigurations,resourceNames=kubelock-validating-webhook-configuration;kubelock-fenced-objects,verbs=get;update

const (
	certName = "tls.crt"
	keyName  = "tls.key"
	// certFieldOwner is the field manager of the caBundle writes.
	certFieldOwner = "kubelock-cert-rotator"
)

// DefaultWebhookCertDir is where the webhook server reads tls.crt and tls.key:
// controller-runtime's default, an emptyDir (self-rotation) or the mounted
// cert-manager Secret in the Deployment.
func DefaultWebhookCertDir() string {
	return filepath.Join(os.TempDir(), "k8s-webhook-server", "serving-certs")
}

// webhookDNSNames are the names the serving certificate is valid for: the
// Service's in-cluster names first (the first is the one the rotator checks).
func (o *Options) webhookDNSNames() []string {
	svc, ns := o.WebhookServiceName, o.CertSecretNamespace
	names := []string{
		fmt.Sprintf("%s.%s.svc", svc, ns),
		fmt.Sprintf("%s.%s.svc.cluster.local", svc, ns),
		fmt.Sprintf("%s.%s", svc, ns),
	}
	return append(names, o.CertExtraDNSNames...)
}

// setupWebhook serves the lock validator on every replica (the server needs no
// leader election) and, with CertRotation, provisions and rotates its serving
// certificate. Readiness waits for a serving certificate and, when rotating,
// for the caBundle to be injected.
func setupWebhook(ctx context.Context, mgr manager.Manager, r *controllers.Reconciler, o Options, log logr.Logger) error {
	users, err := webhookControllerUsers(ctx, r, o)
	if err != nil {
		return err
	}
	srv := mgr.GetWebhookServer() // adds the server to the manager
	// Fenced objects compare against the lock's current token: read it from
	// the apiserver, not from the cache.
	if err := webhook.Setup(srv, mgr.GetScheme(), mgr.GetAPIReader(), mgr.GetClient(), users...); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("webhook", srv.StartedChecker()); err != nil {
		return err
	}
	log.Info("admission webhook", "port", o.WebhookPort, "certDir", o.WebhookCertDir, "path", webhook.Path,
		"controllerUsers", users, "certRotation", o.CertRotation)
	if !o.CertRotation {
		return nil
	}

	secret := types.NamespacedName{Namespace: o.CertSecretNamespace, Name: o.CertSecretName}
	dns := o.webhookDNSNames()
	injected := make(chan struct{})
	// The fenced-objects configuration is optional: while it does not exist
	// the rotator logs and skips it.
	hooks := []rotator.WebhookInfo{{Name: o.WebhookConfigName, Type: rotator.Validating}}
	if o.FencedWebhookConfigName != "" {
		hooks = append(hooks, rotator.WebhookInfo{Name: o.FencedWebhookConfigName, Type: rotator.Validating})
	}
	if err := rotator.AddRotator(mgr, &rotator.CertRotator{
		SecretKey:      secret,
		CertDir:        o.WebhookCertDir,
		CAName:         "kubelock-webhook-ca",
		CAOrganization: "kubelock",
		DNSName:        dns[0],
		ExtraDNSNames:  dns[1:],
		IsReady:        injected,
		Webhooks:       hooks,
		FieldOwner:     certFieldOwner,
		ControllerName: "cert-rotator",
		// Every replica serves the webhook, so every replica keeps its files
		// current; concurrent Secret updates are resolved by resourceVersion.
		RequireLeaderElection: false,
	}); err != nil {
		return fmt.Errorf("setting up certificate rotation: %w", err)
	}
	if err := mgr.Add(&secretToFiles{mgr: mgr, key: secret, dir: o.WebhookCertDir}); err != nil {
		return err
	}
	return mgr.AddReadyzCheck("webhook-ca-injected", func(*http.Request) error {
		select {
		case <-injected:
			return nil
		default:
			return fmt.Errorf("the CA is not yet injected into ValidatingWebhookConfiguration %s", o.WebhookConfigName)
		}
	})
}

// webhookControllerUsers are the user names the validator lets expire holdings
// and drop waiters: the flag's, or else the controller's own (the name it
// writes as endedBy), learned with a SelfSubjectReview.
func webhookControllerUsers(ctx context.Context, r *controllers.Reconciler, o Options) ([]string, error) {
	if len(o.WebhookControllerUsers) > 0 {
		return o.WebhookControllerUsers, nil
	}
	var name string
	var last error
	err := wait.PollUntilContextTimeout(ctx, time.Second, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		name, last = r.Username(ctx)
		return last == nil, nil
	})
	if err != nil {
		return nil, fmt.Errorf("learning the controller's user name for the webhook (set --webhook-controller-users to skip): %w", errors.Join(err, last))
	}
	return []string{name}, nil
}

// certWaitingServer is the webhook server, started only once its certificate
// files exist: cert-controller writes the Secret a moment after start, and a
// mounted cert-manager Secret may still be empty. Until then /readyz fails.
//
// It serves until Drain, not until the manager stops it. controller-runtime
// stops webhooks before it releases the leader election, and a replica that
// stops is still among the webhook Service's endpoints for a moment: the
// apiserver keeps sending it admission requests, the release of the
// election's own lock among them. A server stopped that early failed those
// requests, and a release that failed for its whole deadline left the lock to
// expire (lease plus grace) instead of handing it over at once.
//
// The server speaks TLS only (controller-runtime listens with tls.Listen; a
// plain-HTTP request gets Go's fixed "400 Client sent an HTTP request to an
// HTTPS server" and never reaches a handler). With a client CA it also
// completes the handshake only with clients holding a certificate that CA signed.
type certWaitingServer struct {
	ctrlwebhook.Server
	dir string
	// clientAuth is set when client certificates are required.
	clientAuth bool
	// serving is set once the certificate exists and the server starts.
	serving atomic.Bool

	// stop ends serving; stopped is closed once the server returned. Both
	// are set when serving starts, under mu.
	mu      sync.Mutex
	stop    context.CancelFunc
	stopped chan struct{}
}

func newWebhookServer(o Options) (*certWaitingServer, error) {
	opts := []func(*tls.Config){func(c *tls.Config) { c.MinVersion = tls.VersionTLS12 }}
	if o.EnableWebhook && o.WebhookClientCAFile != "" {
		opt, err := requireClientCerts(o.WebhookClientCAFile)
		if err != nil {
			return nil, err
		}
		opts = append(opts, opt)
	}
	return &certWaitingServer{
		Server: ctrlwebhook.NewServer(ctrlwebhook.Options{
			Host:     o.WebhookHost,
			Port:     o.WebhookPort,
			CertDir:  o.WebhookCertDir,
			CertName: certName,
			KeyName:  keyName,
			TLSOpts:  opts,
		}),
		dir:        o.WebhookCertDir,
		clientAuth: o.WebhookClientCAFile != "",
	}, nil
}

// requireClientCerts makes the TLS handshake require a client certificate
// signed by a CA in file. (controller-runtime's ClientCAName does the same
// for a file inside the serving certificate's directory; this one may live
// anywhere, e.g. a ConfigMap mount next to the self-rotated emptyDir.)
func requireClientCerts(file string) (func(*tls.Config), error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("reading --webhook-client-ca-file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("--webhook-client-ca-file %s holds no PEM certificate", file)
	}
	return func(c *tls.Config) {
		c.ClientCAs = pool
		c.ClientAuth = tls.RequireAndVerifyClientCert
	}, nil
}

// StartedChecker reports readiness. controller-runtime's check dials the
// server without a client certificate, which a server that requires one
// refuses (and logs, at every probe); then the check is that the serving
// certificate exists and the server was started.
func (s *certWaitingServer) StartedChecker() healthz.Checker {
	if !s.clientAuth {
		return s.Server.StartedChecker()
	}
	return func(*http.Request) error {
		if !s.serving.Load() {
			return errors.New("webhook server has not been started yet")
		}
		return nil
	}
}

func (s *certWaitingServer) Start(ctx context.Context) error {
	log := ctrl.Log.WithName("webhook")
	files := []string{filepath.Join(s.dir, certName), filepath.Join(s.dir, keyName)}
	var next time.Time
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(context.Context) (bool, error) {
		pair, err := tls.LoadX509KeyPair(files[0], files[1])
		if err == nil && len(pair.Certificate) > 0 {
			return true, nil
		}
		if time.Now().After(next) {
			log.Info("waiting for the serving certificate", "files", files, "reason", err)
			next = time.Now().Add(30 * time.Second)
		}
		return false, nil
	})
	if err != nil {
		return nil //nolint:nilerr // stopped before the certificate came: no failure
	}
	s.serving.Store(true)
	serveCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	stopped := make(chan struct{})
	s.mu.Lock()
	s.stop, s.stopped = stop, stopped
	s.mu.Unlock()
	failed := make(chan error, 1)
	go func() {
		defer close(stopped)
		defer s.serving.Store(false)
		failed <- s.Server.Start(serveCtx)
	}()
	select {
	case err := <-failed:
		return err
	case <-ctx.Done():
		return nil // serving on until Drain
	}
}

// drainTimeout bounds Drain: in-flight admission requests take at most the
// webhook configuration's timeoutSeconds (5).
const drainTimeout = 10 * time.Second

// Drain stops serving, once the manager stopped: in-flight requests finish
// (within drainTimeout), new ones are refused.
func (s *certWaitingServer) Drain() {
	s.mu.Lock()
	stop, stopped := s.stop, s.stopped
	s.mu.Unlock()
	if stop == nil {
		return // never served
	}
	stop()
	select {
	case <-stopped:
	case <-time.After(drainTimeout):
		ctrl.Log.WithName("webhook").Info("the webhook server did not stop within its drain timeout; exiting anyway", "timeout", drainTimeout)
	}
}

// secretToFiles keeps tls.crt and tls.key in dir equal to the rotated Secret's,
// so the webhook server (which watches the files) serves a rotated certificate
// within moments, without a Secret volume and the kubelet's sync delay. It
// watches only that one Secret.
type secretToFiles struct {
	mgr manager.Manager
	key types.NamespacedName
	dir string

	mu sync.Mutex // serialises writes
}

// NeedLeaderElection is false: every replica serves the webhook.
func (s *secretToFiles) NeedLeaderElection() bool { return false }

func (s *secretToFiles) Start(ctx context.Context) error {
	log := ctrl.Log.WithName("webhook-cert-files").WithValues("secret", s.key, "dir", s.dir)
	c, err := cache.New(s.mgr.GetConfig(), cache.Options{
		Scheme:            s.mgr.GetScheme(),
		Mapper:            s.mgr.GetRESTMapper(),
		DefaultNamespaces: map[string]cache.Config{s.key.Namespace: {}},
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Secret{}: {Field: fields.OneTermEqualSelector("metadata.name", s.key.Name)},
		},
	})
	if err != nil {
		return err
	}
	inf, err := c.GetInformer(ctx, &corev1.Secret{})
	if err != nil {
		return err
	}
	write := func(obj any) {
		sec, ok := obj.(*corev1.Secret)
		if !ok || sec.Name != s.key.Name || sec.Namespace != s.key.Namespace {
			return
		}
		switch wrote, err := s.write(sec.Data[certName], sec.Data[keyName]); {
		case err != nil:
			log.Error(err, "writing the serving certificate")
		case wrote:
			log.Info("serving certificate written")
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    write,
		UpdateFunc: func(_, obj any) { write(obj) },
	}); err != nil {
		return err
	}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return fmt.Errorf("creating the certificate directory: %w", err)
	}
	return c.Start(ctx)
}

// write replaces the files when crt and key are a valid pair that differs from
// what is on disk. Each file is replaced atomically, the key first, so the
// server's watcher reloads a matching pair on the certificate's event.
func (s *secretToFiles) write(crt, key []byte) (bool, error) {
	if len(crt) == 0 || len(key) == 0 {
		return false, nil // not issued yet
	}
	if _, err := tls.X509KeyPair(crt, key); err != nil {
		return false, fmt.Errorf("the Secret holds no valid key pair: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	oldCrt, _ := os.ReadFile(filepath.Join(s.dir, certName))
	oldKey, _ := os.ReadFile(filepath.Join(s.dir, keyName))
	if bytes.Equal(oldCrt, crt) && bytes.Equal(oldKey, key) {
		return false, nil
	}
	if err := renameio.WriteFile(filepath.Join(s.dir, keyName), key, 0o600); err != nil {
		return false, err
	}
	return true, renameio.WriteFile(filepath.Join(s.dir, certName), crt, 0o600)
}

// setList sets *list from a comma-separated flag value, dropping blanks.
func setList(list *[]string) func(string) error {
	return func(s string) error {
		*list = nil
		for _, p := range strings.Split(s, ",") {
			if p = strings.TrimSpace(p); p != "" {
				*list = append(*list, p)
			}
		}
		return nil
	}
}
