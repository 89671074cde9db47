// Package manager wires the kubelock operator: flags, logging, the
// controller-runtime manager with leader election, probes and metrics, the
// DistributedLock controller, and the validating admission webhook with its
// self-rotating serving certificate. cmd/manager only calls Main.
package operator

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/controllers"
	"github.com/kubelock/kubelock/internal/metrics"
)

// Options are the operator's settings; BindFlags documents each with its flag.
type Options struct {
	MetricsAddr    string
	MetricsSecure  bool
	MetricsCertDir string
	ProbeAddr      string
	PprofAddr      string

	LeaderElect             bool
	LeaderElectionNamespace string
	LeaderElectionID        string
	// LeaderElectionLock is what the replicas elect on: ElectOnLease or
	// ElectOnKubelock (a DistributedLock named LeaderElectionID, on which
	// they campaign as LeaderElectionServiceAccount).
	LeaderElectionLock           string
	LeaderElectionServiceAccount string
	// The leader election's timings (client-go's defaults: 15s, 10s, 2s).
	// Shorter ones let a standby take over sooner; longer ones ride out
	// apiserver latency without losing leadership. A new leader never
	// expires a lease early either way.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration

	ExpiryGrace time.Duration
	IdleTimeout time.Duration
	Username    string
	Concurrency int
	// Events is the controller's event policy (controllers.EventPolicy by name).
	Events string

	EnableWebhook          bool
	WebhookPort            int
	WebhookHost            string
	WebhookCertDir         string
	WebhookClientCAFile    string
	WebhookControllerUsers []string
	// CertRotation: the serving certificate in the Secret
	// CertSecretNamespace/CertSecretName, written to WebhookCertDir, and the
	// caBundle of WebhookConfigName (and FencedWebhookConfigName, if set).
	CertRotation            bool
	CertSecretName          string
	CertSecretNamespace     string
	WebhookServiceName      string
	WebhookConfigName       string
	FencedWebhookConfigName string
	CertExtraDNSNames       []string
	// LockAPIServerServiceName: the Service of kubelock-apiserver, which
	// serves the lock API (the apiserver backend). The operator waits for
	// the lock API at start and, with CertRotation, rotates kubelock-apiserver's
	// serving certificate, in the Secret LockAPIServerCertSecretName (copied
	// to LockAPIServerCertDir), with the APIService's caBundle.
	LockAPIServerServiceName    string
	LockAPIServerCertSecretName string
	LockAPIServerCertDir        string

	Zap zap.Options
}

// DefaultOptions returns the defaults the flags show in --help.
func DefaultOptions() Options {
	return Options{
		MetricsAddr:      ":8443",
		MetricsSecure:    true,
		ProbeAddr:        ":8081",
		LeaderElect:      true,
		LeaderElectionID: "kubelock-manager.locks.kubelock.io",
		// Lease as config/default has it; the chart elects on kubelock.
		LeaderElectionLock:           ElectOnLease,
		LeaderElectionServiceAccount: "kubelock-leader-election",
		LeaseDuration:                15 * time.Second,
		RenewDeadline:                10 * time.Second,
		RetryPeriod:                  2 * time.Second,
		ExpiryGrace:                  controllers.DefaultExpiryGrace,
		IdleTimeout:                  controllers.DefaultIdleTimeout,
		Concurrency:                  4,
		Events:                       string(controllers.EventsImportant),

		EnableWebhook:           true,
		WebhookPort:             9443,
		WebhookCertDir:          DefaultWebhookCertDir(),
		CertRotation:            true,
		CertSecretName:          "kubelock-webhook-server-cert",
		CertSecretNamespace:     "kubelock-system",
		WebhookServiceName:      "kubelock-webhook-service",
		WebhookConfigName:       "kubelock-validating-webhook-configuration",
		FencedWebhookConfigName: "kubelock-fenced-objects",

		LockAPIServerCertSecretName: "kubelock-apiserver-cert",
		LockAPIServerCertDir:        DefaultLockAPIServerCertDir(),
	}
}

// BindFlags registers a flag for each option on fs, with o's values as defaults.
func (o *Options) BindFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.MetricsAddr, "metrics-bind-address", o.MetricsAddr, `Address the metrics endpoint binds to; "0" disables it.`)
	fs.BoolVar(&o.MetricsSecure, "metrics-secure", o.MetricsSecure, "Serve metrics over HTTPS, only to clients whose bearer token the apiserver authenticates (TokenReview) and authorizes for get on /metrics (SubjectAccessReview); false serves plain HTTP to anyone.")
	fs.StringVar(&o.MetricsCertDir, "metrics-cert-dir", o.MetricsCertDir, "Directory with the metrics server's tls.crt and tls.key (with --metrics-secure); empty means a self-signed certificate.")
	fs.StringVar(&o.ProbeAddr, "health-probe-bind-address", o.ProbeAddr, `Address the /healthz and /readyz probes bind to; "0" disables them.`)
	fs.StringVar(&o.PprofAddr, "pprof-bind-address", o.PprofAddr, `Address Go's /debug/pprof profiles (heap, CPU) are served on, over plain HTTP to anyone who can reach it; empty or "0" disables them.`)
	fs.BoolVar(&o.LeaderElect, "leader-elect", o.LeaderElect, "Elect a leader so that only one replica expires leases and moves queues.")
	fs.StringVar(&o.LeaderElectionNamespace, "leader-election-namespace", o.LeaderElectionNamespace, "Namespace of the leader Lease; empty means the pod's own namespace (required out of cluster).")
	fs.StringVar(&o.LeaderElectionID, "leader-election-id", o.LeaderElectionID, "Name of the leader Lease, or of the DistributedLock with --leader-election-lock=kubelock.")
	fs.StringVar(&o.LeaderElectionLock, "leader-election-lock", o.LeaderElectionLock, `What the replicas elect their leader on: "lease" (a coordination.k8s.io Lease) or "kubelock" (a DistributedLock in the leader election namespace, auto-created: queue hand-off, fencing token, server-enforced ownership; a standby expires a dead leader's holding).`)
	fs.StringVar(&o.LeaderElectionServiceAccount, "leader-election-service-account", o.LeaderElectionServiceAccount, "With --leader-election-lock=kubelock: the service account (in the leader election namespace) the replicas campaign as, with tokens the manager requests for it (10 minutes, bound to no pod: the pod runs as another account); admission never lets the controller's own user acquire a lock. Each replica holds as POD_NAME, else the host name.")
	fs.DurationVar(&o.LeaseDuration, "leader-election-lease-duration", o.LeaseDuration, "How long a standby waits after the leader's last renewal before it takes over.")
	fs.DurationVar(&o.RenewDeadline, "leader-election-renew-deadline", o.RenewDeadline, "How long the leader keeps trying to renew before it gives up leadership; must be below the lease duration.")
	fs.DurationVar(&o.RetryPeriod, "leader-election-retry-period", o.RetryPeriod, "How often candidates try to acquire or renew the leader Lease; must be below the renew deadline.")
	fs.DurationVar(&o.ExpiryGrace, "expiry-grace", o.ExpiryGrace, "Grace added to a holder's lease before the controller expires it, measured from the last renewal the controller observed.")
	fs.DurationVar(&o.IdleTimeout, "auto-created-idle-timeout", o.IdleTimeout, "Delete locks labeled "+locksv1alpha1.AutoCreatedLabel+"=true once they stayed free with an empty queue this long.")
	fs.StringVar(&o.Username, "controller-username", o.Username, "User name written to recentAcquisitions[].endedBy on expiry; empty means learn it with a SelfSubjectReview.")
	fs.StringVar(&o.Events, "events", o.Events, `Which lock transitions the controller reports as Events: "important" (expiries, force-releases, ends with a session, dropped waiters, idle-lock deletions) or "all" (one per acquisition and release too; each is an apiserver write). Metrics count every transition either way.`)
	fs.IntVar(&o.Concurrency, "concurrency", o.Concurrency, "Number of locks reconciled in parallel.")
	fs.BoolVar(&o.EnableWebhook, "enable-webhook", o.EnableWebhook, "Serve the validating admission webhook for DistributedLocks (on every replica, not only the leader).")
	fs.IntVar(&o.WebhookPort, "webhook-port", o.WebhookPort, "HTTPS port of the admission webhook server.")
	fs.StringVar(&o.WebhookHost, "webhook-host", o.WebhookHost, "Address the admission webhook server binds to; empty means all addresses.")
	fs.StringVar(&o.WebhookCertDir, "webhook-cert-dir", o.WebhookCertDir, "Directory with the webhook's serving tls.crt and tls.key; the server starts, and /readyz passes, once they exist.")
	fs.StringVar(&o.WebhookClientCAFile, "webhook-client-ca-file", o.WebhookClientCAFile, "PEM file of the CAs whose client certificates the webhook server requires (the apiserver's, from its --admission-control-config-file); empty accepts any TLS client. Read at start.")
	fs.Func("webhook-controller-users", "Comma-separated user names the webhook lets expire holdings and drop waiters; empty means the controller's own user name (--controller-username, or learned with a SelfSubjectReview).", setList(&o.WebhookControllerUsers))
	fs.BoolVar(&o.CertRotation, "cert-rotation", o.CertRotation, "Provision and rotate the webhook's serving certificate in --cert-secret-name, write it to --webhook-cert-dir and keep the caBundle of --webhook-config-name current; turn off when cert-manager issues the certificate.")
	fs.StringVar(&o.CertSecretName, "cert-secret-name", o.CertSecretName, "Secret (existing, may be empty) in which --cert-rotation keeps the CA and the serving certificate.")
	fs.StringVar(&o.CertSecretNamespace, "cert-secret-namespace", o.CertSecretNamespace, "The operator's namespace: that of --cert-secret-name and of --webhook-service-name.")
	fs.StringVar(&o.WebhookServiceName, "webhook-service-name", o.WebhookServiceName, "Service in front of the webhook; the certificate is issued for <service>.<namespace>.svc.")
	fs.StringVar(&o.WebhookConfigName, "webhook-config-name", o.WebhookConfigName, "ValidatingWebhookConfiguration whose caBundle --cert-rotation keeps current.")
	fs.StringVar(&o.FencedWebhookConfigName, "fenced-webhook-config-name", o.FencedWebhookConfigName, "ValidatingWebhookConfiguration of the optional fenced-objects component whose caBundle --cert-rotation also keeps current (logged and skipped while it does not exist); empty means none.")
	fs.StringVar(&o.LockAPIServerServiceName, "lock-apiserver-service-name", o.LockAPIServerServiceName, "Service of kubelock-apiserver, which serves the lock API (the apiserver backend): the operator waits at start until kube-apiserver serves the lock API, and with --cert-rotation issues and rotates kubelock-apiserver's serving certificate, in --lock-apiserver-cert-secret-name, and keeps the caBundle of the APIService "+LockAPIServiceName+" current; empty means the CRD backend.")
	fs.StringVar(&o.LockAPIServerCertSecretName, "lock-apiserver-cert-secret-name", o.LockAPIServerCertSecretName, "Secret (in --cert-secret-namespace; existing, may be empty) in which --cert-rotation keeps the lock apiserver's CA and serving certificate; its pods mount it.")
	fs.StringVar(&o.LockAPIServerCertDir, "lock-apiserver-cert-dir", o.LockAPIServerCertDir, "Directory the operator copies the lock apiserver's rotated certificate to (the rotator checks that it arrives there).")
	fs.Func("cert-extra-dns-names", "Comma-separated extra DNS names for the self-rotated serving certificate.", setList(&o.CertExtraDNSNames))
	o.Zap.BindFlags(fs)
}

// Validate checks the options up front.
func (o *Options) Validate() error {
	var errs []error
	if o.ExpiryGrace < 0 {
		errs = append(errs, fmt.Errorf("--expiry-grace must not be negative, got %s", o.ExpiryGrace))
	}
	if o.IdleTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--auto-created-idle-timeout must be positive, got %s", o.IdleTimeout))
	}
	if _, err := controllers.ParseEventPolicy(o.Events); err != nil {
		errs = append(errs, fmt.Errorf("--events must be %q or %q, got %q", controllers.EventsImportant, controllers.EventsAll, o.Events))
	}
	if o.Concurrency < 1 {
		errs = append(errs, fmt.Errorf("--concurrency must be at least 1, got %d", o.Concurrency))
	}
	if o.LeaderElect && o.LeaderElectionID == "" {
		errs = append(errs, errors.New("--leader-election-id must not be empty with --leader-elect"))
	}
	if o.LeaderElect && !(0 < o.RetryPeriod && o.RetryPeriod < o.RenewDeadline && o.RenewDeadline < o.LeaseDuration) {
		errs = append(errs, fmt.Errorf("leader election needs 0 < retry period (%s) < renew deadline (%s) < lease duration (%s)", o.RetryPeriod, o.RenewDeadline, o.LeaseDuration))
	}
	switch o.LeaderElectionLock {
	case ElectOnLease:
	case ElectOnKubelock:
		if err := o.electionTimings().Validate(); o.LeaderElect && err != nil {
			errs = append(errs, fmt.Errorf("--leader-election-lock=kubelock: %w", err))
		}
		if o.LeaderElect && o.LeaderElectionServiceAccount == "" {
			errs = append(errs, errors.New("--leader-election-service-account must not be empty with --leader-election-lock=kubelock"))
		}
	default:
		errs = append(errs, fmt.Errorf("--leader-election-lock must be %q or %q, got %q", ElectOnLease, ElectOnKubelock, o.LeaderElectionLock))
	}
	if o.EnableWebhook {
		if o.WebhookPort < 1 || o.WebhookPort > 65535 {
			errs = append(errs, fmt.Errorf("--webhook-port must be in 1..65535, got %d", o.WebhookPort))
		}
		if o.WebhookCertDir == "" {
			errs = append(errs, errors.New("--webhook-cert-dir must not be empty with --enable-webhook"))
		}
	}
	if o.EnableWebhook && o.CertRotation {
		for _, f := range []struct{ flag, value string }{
			{"--cert-secret-name", o.CertSecretName}, {"--cert-secret-namespace", o.CertSecretNamespace},
			{"--webhook-service-name", o.WebhookServiceName}, {"--webhook-config-name", o.WebhookConfigName},
		} {
			if f.value == "" {
				errs = append(errs, fmt.Errorf("%s must not be empty with --cert-rotation", f.flag))
			}
		}
	}
	if o.CertRotation && o.LockAPIServerServiceName != "" {
		for _, f := range []struct{ flag, value string }{
			{"--lock-apiserver-cert-secret-name", o.LockAPIServerCertSecretName}, {"--cert-secret-namespace", o.CertSecretNamespace},
			{"--lock-apiserver-cert-dir", o.LockAPIServerCertDir},
		} {
			if f.value == "" {
				errs = append(errs, fmt.Errorf("%s must not be empty with --cert-rotation and --lock-apiserver-service-name", f.flag))
			}
		}
	}
	return errors.Join(errs...)
}

// Main parses args (without the program name), runs the operator until SIGTERM
// or SIGINT, and returns the process exit code.
func Main(args []string, stderr io.Writer) int {
	opts := DefaultOptions()
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: manager [flags]\n\nThe kubelock operator: expires DistributedLock leases, keeps wait queues moving, deletes idle auto-created locks, and serves the validating admission webhook that enforces the lock rules.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	opts.BindFlags(fs)
	config.RegisterFlags(fs) // --kubeconfig
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if err := opts.Validate(); err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts.Zap)))
	log := ctrl.Log.WithName("setup")
	cfg, err := ctrl.GetConfig()
	if err != nil {
		log.Error(err, "loading the kubeconfig")
		return 1
	}
	if err := Run(ctrl.SetupSignalHandler(), cfg, opts); err != nil {
		log.Error(err, "manager stopped")
		return 1
	}
	return 0
}

// Scheme returns a scheme with the built-in types and the kubelock API.
func Scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := locksv1alpha1.AddToScheme(s); err != nil {
		return nil, err
	}
	return s, nil
}

// Run starts the manager with the controller and blocks until ctx ends.
func Run(ctx context.Context, cfg *rest.Config, o Options) error {
	log := ctrl.Log.WithName("setup")
	scheme, err := Scheme()
	if err != nil {
		return err
	}
	if o.LockAPIServerServiceName != "" {
		ctx, err = lockAPIServerBackend(ctx, cfg, scheme, o, log)
		if errors.Is(err, context.Canceled) {
			return nil // stopped while it waited for the lock API
		}
		if err != nil {
			return err
		}
	}
	webhookServer, err := newWebhookServer(o)
	if err != nil {
		return err
	}
	// The lock to elect on; nil for controller-runtime's Lease.
	var electionLock resourcelock.Interface
	var electionKey types.NamespacedName
	if o.LeaderElect && o.LeaderElectionLock == ElectOnKubelock {
		if electionLock, electionKey, err = kubelockElection(cfg, o); err != nil {
			return fmt.Errorf("leader election on kubelock: %w", err)
		}
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  scheme,
		WebhookServer:           webhookServer, // added to the manager only with --enable-webhook
		Metrics:                 metricsOptions(o),
		HealthProbeBindAddress:  o.ProbeAddr,
		PprofBindAddress:        o.PprofAddr,
		LeaderElection:          o.LeaderElect,
		LeaderElectionID:        o.LeaderElectionID,
		LeaderElectionNamespace: o.LeaderElectionNamespace,
		// Set only for --leader-election-lock=kubelock; it takes the timings below.
		LeaderElectionResourceLockInterface: electionLock,
		LeaseDuration:                       &o.LeaseDuration,
		RenewDeadline:                       &o.RenewDeadline,
		RetryPeriod:                         &o.RetryPeriod,
		// Safe because the process exits right after the manager stops, and a
		// new leader times every lease from a renewal it saw itself (as a
		// standby or since), so it never expires early.
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	ropts := []controllers.Option{
		controllers.WithExpiryGrace(o.ExpiryGrace),
		controllers.WithIdleTimeout(o.IdleTimeout),
		controllers.WithUsername(o.Username),
		controllers.WithEvents(controllers.EventPolicy(o.Events)),
		controllers.WithControllerOptions(controller.Options{MaxConcurrentReconciles: o.Concurrency}),
	}
	if clk := testingClock(); clk != nil {
		log.Info("TESTING ONLY (build tag faults): the controller's wall clock is shifted by the duration in a file")
		ropts = append(ropts, controllers.WithClock(clk))
	}
	metrics.Register()
	r, err := controllers.Setup(mgr, ropts...)
	if err != nil {
		return fmt.Errorf("setting up the controller: %w", err)
	}
	if electionLock != nil {
		// Only the leader runs the controller: a standby must end a dead
		// leader's holding of the election lock itself, or nobody would.
		if err := controllers.SetupStandby(mgr, electionKey, ropts...); err != nil {
			return fmt.Errorf("setting up the election lock's standby controller: %w", err)
		}
	}
	// Learn the controller's user name now, so a missing permission shows at
	// start; the controller retries on its first expiry if this fails.
	if name, err := r.Username(ctx); err != nil {
		log.Error(err, "cannot learn the controller's user name yet; will retry on first expiry")
	} else {
		log.Info("controller identity", "username", name)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return err
	}
	if o.EnableWebhook {
		if err := setupWebhook(ctx, mgr, r, o, log); err != nil {
			return err
		}
	}
	log.Info("starting manager", "leaderElection", o.LeaderElect, "electOn", o.LeaderElectionLock, "expiryGrace", o.ExpiryGrace, "idleTimeout", o.IdleTimeout, "webhook", o.EnableWebhook)
	err = mgr.Start(ctx)
	// The webhook served on through the stop, the election's release included.
	webhookServer.Drain()
	if err != nil {
		return err
	}
	// The lock apiserver's certificate rotation may have ended ctx.
	if cause := context.Cause(ctx); !errors.Is(cause, context.Canceled) {
		return cause
	}
	return nil
}

// DefaultGCPercent is the operator's GC target unless GOGC sets one. Its
// heap is mostly the controller's cache of every lock, long-lived, so Go's
// default (collect when the heap doubled) would hold about twice that cache;
// 50 holds about 1.5 times it for a few percent more CPU.
const DefaultGCPercent = 50

// Exit runs Main with the process arguments and exits.
func Exit() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(DefaultGCPercent)
	}
	os.Exit(Main(os.Args[1:], os.Stderr))
}

// Metrics are served over HTTPS to callers the apiserver authenticates (a
// bearer token, TokenReview) and authorizes (get on the non-resource URL
// /metrics, SubjectAccessReview): config/rbac's kubelock-metrics-reader
// ClusterRole grants that, config/prometheus scrapes with it.
//
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// metricsOptions configures controller-runtime's metrics server from o.
func metricsOptions(o Options) metricsserver.Options {
	m := metricsserver.Options{BindAddress: o.MetricsAddr}
	if !o.MetricsSecure {
		return m
	}
	m.SecureServing = true
	m.FilterProvider = filters.WithAuthenticationAndAuthorization
	m.CertDir = o.MetricsCertDir
	m.TLSOpts = []func(*tls.Config){func(c *tls.Config) {
		c.MinVersion = tls.VersionTLS12
		// HTTP/1.1 only: no exposure to HTTP/2 stream-reset floods
		// (CVE-2023-44487) on an endpoint any pod can reach.
		c.NextProtos = []string{"http/1.1"}
	}}
	return m
}
