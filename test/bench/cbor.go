package main

import (
	"context"
	"fmt"
	"mime"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/runtime/serializer/cbor"
	"k8s.io/apimachinery/pkg/watch"
	clientfeatures "k8s.io/client-go/features"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
)

// Wire encodings of the kubelock clients (--encoding).
const (
	encJSON = "json"
	encCBOR = "cbor"
)

// cborGateEnv turns on client-go's ClientsAllowCBOR gate (client-go reads its
// gates from KUBE_FEATURE_<name> once, at first use). Without it a REST
// client quietly rewrites application/cbor to application/json.
const cborGateEnv = "KUBE_FEATURE_" + string(clientfeatures.ClientsAllowCBOR)

// allowCBOR enables ClientsAllowCBOR for this process and checks that it took
// effect (it does not when something read the gates before). It leaves
// ClientsPreferCBOR off: that would switch every client whose content type is
// not set to CBOR, the operator's controller-runtime clients in tests and the
// baselines' among them, and controller-runtime's typed client has no CBOR
// codec to honour it with.
func allowCBOR() error {
	if err := os.Setenv(cborGateEnv, "true"); err != nil {
		return err
	}
	if !clientfeatures.FeatureGates().Enabled(clientfeatures.ClientsAllowCBOR) {
		return fmt.Errorf("client-go's %s gate is off although %s=true: the gates were read before it was set", clientfeatures.ClientsAllowCBOR, cborGateEnv)
	}
	return nil
}

// lockClientFactory builds a pkg/lock client that speaks one wire encoding.
type lockClientFactory func(cfg *rest.Config, opts ...lock.Option) (*lock.Client, error)

func lockClients(encoding string, counts *mediaTypes) lockClientFactory {
	if encoding != encCBOR {
		return func(cfg *rest.Config, opts ...lock.Option) (*lock.Client, error) {
			return lock.New(counted(cfg, counts), opts...)
		}
	}
	return func(cfg *rest.Config, opts ...lock.Option) (*lock.Client, error) {
		c, err := newCBORClient(counted(cfg, counts))
		if err != nil {
			return nil, err
		}
		return lock.NewFromClient(c, opts...)
	}
}

// cborClient is a controller-runtime client whose DistributedLock and
// LockSession requests and responses are CBOR (KEP-4222), for pkg/lock's
// NewFromClient. controller-runtime v0.25 cannot do this itself: its typed
// client builds its codecs with serializer.NewCodecFactory (JSON, YAML,
// protobuf: no CBOR), and its unstructured client sends CBOR only under the
// process-wide ClientsPreferCBOR gate. So the kubelock kinds go through a
// client-go REST client with a CBOR codec, as client-gen's clients do
// (rest.CodecFactoryForGeneratedClient); everything else (the
// SelfSubjectReview) goes to the embedded JSON client.
type cborClient struct {
	client.WithWatch
	rc     rest.Interface
	params runtime.ParameterCodec
}

func newCBORClient(cfg *rest.Config) (*cborClient, error) {
	scheme, err := lockScheme()
	if err != nil {
		return nil, err
	}
	fallback, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	rc, _, err := cborRESTClient(cfg, scheme)
	if err != nil {
		return nil, err
	}
	return &cborClient{WithWatch: fallback, rc: rc, params: runtime.NewParameterCodec(scheme)}, nil
}

// lockScheme knows the built-in types and the kubelock API.
func lockScheme() (*runtime.Scheme, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	return scheme, locksv1alpha1.AddToScheme(scheme)
}

// cborRESTClient is a REST client of the kubelock API that sends CBOR and
// asks for it, and the encoder of its bodies.
func cborRESTClient(cfg *rest.Config, scheme *runtime.Scheme) (rest.Interface, runtime.Encoder, error) {
	rcfg := rest.CopyConfig(cfg)
	gv := locksv1alpha1.GroupVersion
	rcfg.GroupVersion = &gv
	rcfg.APIPath = "/apis"
	rcfg.ContentType = runtime.ContentTypeCBOR
	// JSON stays acceptable so that an apiserver without CBOR still answers
	// (it refuses CBOR bodies with 415; client-go then falls back to JSON).
	rcfg.AcceptContentTypes = runtime.ContentTypeCBOR + ",application/json;q=0.9"
	codecs := serializer.NewCodecFactory(scheme, serializer.WithSerializer(cbor.NewSerializerInfo)).WithoutConversion()
	rcfg.NegotiatedSerializer = codecs
	if rcfg.UserAgent == "" {
		rcfg.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	rc, err := rest.RESTClientFor(rcfg)
	if err != nil {
		return nil, nil, err
	}
	info, _ := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), runtime.ContentTypeCBOR)
	return rc, codecs.EncoderForVersion(info.Serializer, gv), nil
}

// cborResource is the plural of the kubelock kinds this client encodes as CBOR.
func cborResource(obj runtime.Object) (string, bool) {
	switch obj.(type) {
	case *locksv1alpha1.DistributedLock, *locksv1alpha1.DistributedLockList:
		return "distributedlocks", true
	case *locksv1alpha1.LockSession, *locksv1alpha1.LockSessionList:
		return "locksessions", true
	}
	return "", false
}

func (c *cborClient) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	res, ok := cborResource(obj)
	if !ok {
		return c.WithWatch.Get(ctx, key, obj, opts...)
	}
	o := (&client.GetOptions{}).ApplyOptions(opts)
	return c.rc.Get().Namespace(key.Namespace).Resource(res).Name(key.Name).
		VersionedParams(o.AsGetOptions(), c.params).Do(ctx).Into(obj)
}

func (c *cborClient) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	res, ok := cborResource(list)
	if !ok {
		return c.WithWatch.List(ctx, list, opts...)
	}
	o := (&client.ListOptions{}).ApplyOptions(opts)
	return c.rc.Get().NamespaceIfScoped(o.Namespace, o.Namespace != "").Resource(res).
		VersionedParams(o.AsListOptions(), c.params).Do(ctx).Into(list)
}

func (c *cborClient) Watch(ctx context.Context, list client.ObjectList, opts ...client.ListOption) (watch.Interface, error) {
	res, ok := cborResource(list)
	if !ok {
		return c.WithWatch.Watch(ctx, list, opts...)
	}
	o := (&client.ListOptions{}).ApplyOptions(opts)
	lo := o.AsListOptions()
	lo.Watch = true
	return c.rc.Get().NamespaceIfScoped(o.Namespace, o.Namespace != "").Resource(res).
		VersionedParams(lo, c.params).Watch(ctx)
}

func (c *cborClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	res, ok := cborResource(obj)
	if !ok {
		return c.WithWatch.Create(ctx, obj, opts...)
	}
	o := (&client.CreateOptions{}).ApplyOptions(opts)
	return c.rc.Post().Namespace(obj.GetNamespace()).Resource(res).
		VersionedParams(o.AsCreateOptions(), c.params).Body(obj).Do(ctx).Into(obj)
}

func (c *cborClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	res, ok := cborResource(obj)
	if !ok {
		return c.WithWatch.Update(ctx, obj, opts...)
	}
	return c.put(ctx, res, "", obj, opts)
}

func (c *cborClient) put(ctx context.Context, res, sub string, obj client.Object, opts []client.UpdateOption) error {
	o := (&client.UpdateOptions{}).ApplyOptions(opts)
	r := c.rc.Put().Namespace(obj.GetNamespace()).Resource(res).Name(obj.GetName())
	if sub != "" {
		r = r.SubResource(sub)
	}
	return r.VersionedParams(o.AsUpdateOptions(), c.params).Body(obj).Do(ctx).Into(obj)
}

func (c *cborClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	res, ok := cborResource(obj)
	if !ok {
		return c.WithWatch.Patch(ctx, obj, patch, opts...)
	}
	return c.patch(ctx, res, "", obj, patch, opts)
}

// patch sends the patch as its own media type (JSON merge patch and the
// like); only the response is CBOR.
func (c *cborClient) patch(ctx context.Context, res, sub string, obj client.Object, patch client.Patch, opts []client.PatchOption) error {
	data, err := patch.Data(obj)
	if err != nil {
		return err
	}
	o := (&client.PatchOptions{}).ApplyOptions(opts)
	r := c.rc.Patch(patch.Type()).Namespace(obj.GetNamespace()).Resource(res).Name(obj.GetName())
	if sub != "" {
		r = r.SubResource(sub)
	}
	return r.VersionedParams(o.AsPatchOptions(), c.params).Body(data).Do(ctx).Into(obj)
}

func (c *cborClient) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	res, ok := cborResource(obj)
	if !ok {
		return c.WithWatch.Delete(ctx, obj, opts...)
	}
	o := (&client.DeleteOptions{}).ApplyOptions(opts)
	return c.rc.Delete().Namespace(obj.GetNamespace()).Resource(res).Name(obj.GetName()).
		Body(o.AsDeleteOptions()).Do(ctx).Error()
}

func (c *cborClient) Status() client.SubResourceWriter { return c.SubResource("status") }

func (c *cborClient) SubResource(sub string) client.SubResourceClient {
	return &cborSubResource{c: c, sub: sub, fallback: c.WithWatch.SubResource(sub)}
}

type cborSubResource struct {
	c        *cborClient
	sub      string
	fallback client.SubResourceClient
}

func (s *cborSubResource) Get(ctx context.Context, obj, subResource client.Object, opts ...client.SubResourceGetOption) error {
	return s.fallback.Get(ctx, obj, subResource, opts...)
}

func (s *cborSubResource) Create(ctx context.Context, obj, subResource client.Object, opts ...client.SubResourceCreateOption) error {
	return s.fallback.Create(ctx, obj, subResource, opts...)
}

func (s *cborSubResource) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	res, ok := cborResource(obj)
	if !ok {
		return s.fallback.Update(ctx, obj, opts...)
	}
	o := (&client.SubResourceUpdateOptions{}).ApplyOptions(opts)
	return s.c.put(ctx, res, s.sub, obj, []client.UpdateOption{&o.UpdateOptions})
}

func (s *cborSubResource) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	res, ok := cborResource(obj)
	if !ok {
		return s.fallback.Patch(ctx, obj, patch, opts...)
	}
	o := (&client.SubResourcePatchOptions{}).ApplyOptions(opts)
	return s.c.patch(ctx, res, s.sub, obj, patch, []client.PatchOption{&o.PatchOptions})
}

func (s *cborSubResource) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
	return s.fallback.Apply(ctx, obj, opts...)
}

// --- what the apiserver answered with ------------------------------------------------

// mediaTypes counts the Content-Type of the apiserver's answers to one client
// set, by request method: whether the CRD was served as CBOR is read off the
// wire, not assumed.
type mediaTypes struct {
	mu sync.Mutex
	n  map[string]int // "GET application/cbor"
}

func (m *mediaTypes) add(method, contentType string) {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil || mt == "" {
		mt = "(none)"
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.n == nil {
		m.n = map[string]int{}
	}
	m.n[method+" "+mt]++
}

// String lists the counts, largest first.
func (m *mediaTypes) String() string {
	if m == nil {
		return ""
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	keys := make([]string, 0, len(m.n))
	for k := range m.n {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return m.n[keys[i]] > m.n[keys[j]] || m.n[keys[i]] == m.n[keys[j]] && keys[i] < keys[j]
	})
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s ×%d", k, m.n[k]))
	}
	return strings.Join(parts, ", ")
}

// cborShare is the fraction of answers in CBOR: application/cbor, or
// application/cbor-seq for watches.
func (m *mediaTypes) cborShare() float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	var hit, all int
	for k, v := range m.n {
		all += v
		if strings.HasSuffix(k, " "+runtime.ContentTypeCBOR) || strings.HasSuffix(k, " "+runtime.ContentTypeCBORSequence) {
			hit += v
		}
	}
	if all == 0 {
		return 0
	}
	return float64(hit) / float64(all)
}

// counted wraps cfg's transport to count the media types of lock and
// session answers in counts (nil: cfg unchanged).
func counted(cfg *rest.Config, counts *mediaTypes) *rest.Config {
	if counts == nil {
		return cfg
	}
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(req)
			if err == nil && strings.Contains(req.URL.Path, "/"+locksv1alpha1.GroupVersion.Group+"/") {
				counts.add(req.Method, resp.Header.Get("Content-Type"))
			}
			return resp, err
		})
	})
	return cfg
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// The adapter is a whole client for pkg/lock.
var _ client.WithWatch = (*cborClient)(nil)
