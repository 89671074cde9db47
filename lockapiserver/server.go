// Package lockapiserver is kubelock-apiserver: the lock API
// (locks.kubelock.io/v1alpha1, DistributedLock and LockSession with their
// status subresources) served by an aggregated API server from an etcd of its
// own, behind an APIService. It is built on k8s.io/apiserver's generic
// registry stores: typed objects decoded once, the CRDs' checks and defaults
// in Go (package validation), and kubelock's admission rules in-process
// (package lockrules), with authentication and authorization delegated to
// kube-apiserver.
package lockapiserver

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	endpointsopenapi "k8s.io/apiserver/pkg/endpoints/openapi"
	"k8s.io/apiserver/pkg/registry/rest"
	genericapiserver "k8s.io/apiserver/pkg/server"
	genericoptions "k8s.io/apiserver/pkg/server/options"
	serverstorage "k8s.io/apiserver/pkg/server/storage"
	"k8s.io/apiserver/pkg/util/compatibility"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/klog/v2"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/internal/lockbackend"
	"github.com/kubelock/kubelock/lockapiserver/lockrules"
	"github.com/kubelock/kubelock/lockapiserver/openapi"
	"github.com/kubelock/kubelock/lockapiserver/registry/distributedlock"
	"github.com/kubelock/kubelock/lockapiserver/registry/locksession"
)

// etcdPrefix is where the lock store keeps its keys in its etcd.
const etcdPrefix = "/registry/locks.kubelock.io"

// Storage encodings of the objects in etcd.
var storageMediaTypes = map[string]string{"json": runtime.ContentTypeJSON, "cbor": runtime.ContentTypeCBOR}

// Options are kubelock-apiserver's flags.
type Options struct {
	Recommended *genericoptions.RecommendedOptions
	// ControllerUsers are the user names of kubelock's controller, which the
	// rules let expire holdings and drop waiters.
	ControllerUsers []string
	// StorageEncoding is json or cbor.
	StorageEncoding string
	// CheckBackend refuses to start while the lock CRDs are installed.
	CheckBackend bool
	// AuthorizeByNamespace asks the authorizer about a user's access to a
	// namespace's locks before asking about one lock (byNamespace).
	AuthorizeByNamespace bool
	// ShutdownDelay is how long a stopping replica goes on serving with
	// /readyz failing, so that its endpoint is gone from kube-apiserver's
	// routing before it stops taking requests.
	ShutdownDelay time.Duration
}

// NewOptions are the defaults: delegated authentication and authorization,
// no admission plugins (the rules run in the registry), and priority and
// fairness by the cluster's FlowSchemas, read from kube-apiserver
// (--kubeconfig, or in-cluster). kube-apiserver's applies to every request it
// proxies; this one is what bounds a client that talks to the Service
// straight: without it, one user could fill the server's in-flight limits
// and every other user's writes would be refused.
func NewOptions() *Options {
	r := genericoptions.NewRecommendedOptions(etcdPrefix, nil)
	r.Admission = nil
	r.Etcd.StorageConfig.EncodeVersioner = runtime.NewMultiGroupVersioner(locksv1alpha1.GroupVersion,
		schema.GroupKind{Group: locksv1alpha1.GroupVersion.Group})
	return &Options{Recommended: r, StorageEncoding: "json", CheckBackend: true, AuthorizeByNamespace: true}
}

// AddFlags adds every flag to fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	o.Recommended.AddFlags(fs)
	utilfeature.DefaultMutableFeatureGate.AddFlag(fs)
	fs.StringSliceVar(&o.ControllerUsers, "controller-users", o.ControllerUsers,
		"User names of kubelock's controller (its service account's), which the rules let expire holdings and drop waiters.")
	fs.StringVar(&o.StorageEncoding, "storage-encoding", o.StorageEncoding, "How objects are encoded in etcd: json or cbor.")
	fs.BoolVar(&o.CheckBackend, "check-backend", o.CheckBackend,
		"Refuse to start while the lock CRDs are installed (read with --authorization-kubeconfig, or in-cluster): the cluster serves the lock API from them, "+
			"and a switch while they hold locks could let a fencing token go down.")
	fs.BoolVar(&o.AuthorizeByNamespace, "authorize-by-namespace", o.AuthorizeByNamespace,
		"Authorize a request for one lock or session by the user's access to all of them in its namespace when it has that, and by the object's name only when not: "+
			"one cached SubjectAccessReview answers a user's writes to any of its locks, where asking by name costs kube-apiserver one nearly every lock write. "+
			"The same answer under RBAC; turn it off for an authorizer that allows a namespace but denies names within it.")
	fs.DurationVar(&o.ShutdownDelay, "shutdown-delay-duration", o.ShutdownDelay,
		"On SIGTERM, go on serving this long with /readyz failing before refusing new requests, as kube-apiserver's flag of the same name: "+
			"long enough for the replica's endpoint to leave the Service, so that no request kube-apiserver proxies meets a closed port.")
}

// Validate reports every flag error.
func (o *Options) Validate() []error {
	errs := o.Recommended.Validate()
	if len(o.ControllerUsers) == 0 {
		errs = append(errs, fmt.Errorf("--controller-users is required"))
	}
	if o.ShutdownDelay < 0 {
		errs = append(errs, fmt.Errorf("--shutdown-delay-duration must not be negative, not %s", o.ShutdownDelay))
	}
	if _, ok := storageMediaTypes[o.StorageEncoding]; !ok {
		errs = append(errs, fmt.Errorf("--storage-encoding must be json or cbor, not %q", o.StorageEncoding))
	}
	return errs
}

// Run serves until ctx ends, once its serving certificate is there and
// after the backend check.
func (o *Options) Run(ctx context.Context) error {
	if err := o.waitServingCert(ctx); err != nil {
		return err
	}
	if o.CheckBackend {
		if err := checkBackend(ctx, o.Recommended.Authorization.RemoteKubeConfigFile, lockbackend.APIServer); err != nil {
			return err
		}
	}
	s, err := o.server()
	if err != nil {
		return err
	}
	return s.PrepareRun().RunWithContext(ctx)
}

// waitServingCert waits for --tls-cert-file and --tls-private-key-file: in a
// pod they are a mounted Secret that the operator's rotation or cert-manager
// fills a moment after the chart creates it, and the server reads them at
// start (later rotations it reloads by itself).
func (o *Options) waitServingCert(ctx context.Context) error {
	pair := o.Recommended.SecureServing.ServerCert.CertKey
	if pair.CertFile == "" {
		return nil
	}
	logged := false
	return wait.PollUntilContextCancel(ctx, time.Second, true, func(context.Context) (bool, error) {
		for _, f := range []string{pair.CertFile, pair.KeyFile} {
			if st, err := os.Stat(f); err != nil || st.Size() == 0 {
				if !logged {
					klog.InfoS("waiting for the serving certificate", "file", f)
					logged = true
				}
				return false, nil
			}
		}
		return true, nil
	})
}

// server builds the generic API server with the lock API installed.
func (o *Options) server() (*genericapiserver.GenericAPIServer, error) {
	codec, _, err := serverstorage.NewStorageCodec(serverstorage.StorageCodecConfig{
		StorageMediaType:  storageMediaTypes[o.StorageEncoding],
		StorageSerializer: storageCodecs,
		StorageVersion:    locksv1alpha1.GroupVersion,
		MemoryVersion:     schema.GroupVersion{Group: locksv1alpha1.GroupVersion.Group, Version: runtime.APIVersionInternal},
	})
	if err != nil {
		return nil, err
	}
	o.Recommended.Etcd.StorageConfig.Codec = codec
	// Priority and fairness reads kube-apiserver with --kubeconfig; without
	// it, with the authorization kubeconfig, as the backend check does
	// (in-cluster when neither is given).
	if core := o.Recommended.CoreAPI; core != nil && core.CoreAPIKubeconfigPath == "" {
		core.CoreAPIKubeconfigPath = o.Recommended.Authorization.RemoteKubeConfigFile
	}
	cfg := genericapiserver.NewRecommendedConfig(Codecs)
	cfg.EffectiveVersion = compatibility.DefaultBuildEffectiveVersion()
	// Open watches (kube-apiserver proxies clients' and the garbage
	// collector's) would hold a shutdown for the request timeout (60 s):
	// new requests get a 429 and Retry-After while those in flight drain,
	// then the watches are told to go (GOAWAY) within 2 s, and their clients
	// resume on another replica.
	cfg.ShutdownSendRetryAfter = true
	cfg.ShutdownDelayDuration = o.ShutdownDelay
	namer := endpointsopenapi.NewDefinitionNamer(Scheme)
	cfg.OpenAPIConfig = genericapiserver.DefaultOpenAPIConfig(openapi.GetOpenAPIDefinitions, namer)
	cfg.OpenAPIConfig.Info.Title = "kubelock"
	cfg.OpenAPIV3Config = genericapiserver.DefaultOpenAPIV3Config(openapi.GetOpenAPIDefinitions, namer)
	cfg.OpenAPIV3Config.Info.Title = "kubelock"
	if err := o.Recommended.ApplyTo(cfg); err != nil {
		return nil, err
	}
	if o.AuthorizeByNamespace {
		cfg.Authorization.Authorizer = byNamespace{cfg.Authorization.Authorizer}
	}
	s, err := cfg.Complete().New("kubelock-apiserver", genericapiserver.NewEmptyDelegate())
	if err != nil {
		return nil, err
	}
	rules, err := lockrules.New(cfg.Authorization.Authorizer, o.ControllerUsers)
	if err != nil {
		return nil, err
	}
	group := genericapiserver.NewDefaultAPIGroupInfo(locksv1alpha1.GroupVersion.Group, Scheme, metav1.ParameterCodec, Codecs)
	storage := map[string]rest.Storage{}
	// Sessions first: the lock rules read them from their store.
	if storage["locksessions"], storage["locksessions/status"], err = locksession.NewStorage(Scheme, cfg.RESTOptionsGetter, rules); err != nil {
		return nil, err
	}
	if storage["distributedlocks"], storage["distributedlocks/status"], err = distributedlock.NewStorage(Scheme, cfg.RESTOptionsGetter, rules); err != nil {
		return nil, err
	}
	group.VersionedResourcesStorageMap[locksv1alpha1.GroupVersion.Version] = storage
	if err := s.InstallAPIGroup(&group); err != nil {
		return nil, err
	}
	if err := addReadinessHooks(s, cfg, o.Recommended.Authentication); err != nil {
		return nil, err
	}
	return s, nil
}

// NewCommand is the kubelock-apiserver command.
func NewCommand(ctx context.Context) *cobra.Command {
	o := NewOptions()
	cmd := &cobra.Command{
		Use:   "kubelock-apiserver",
		Short: "Serve the kubelock API (locks.kubelock.io) from an etcd of its own, behind an APIService",
		RunE: func(c *cobra.Command, _ []string) error {
			if errs := o.Validate(); len(errs) > 0 {
				return utilerrors.NewAggregate(errs)
			}
			return o.Run(c.Context())
		},
	}
	cmd.SetContext(ctx)
	o.AddFlags(cmd.Flags())
	cmd.AddCommand(newCheckBackendCommand())
	return cmd
}
