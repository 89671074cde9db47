package lockapi_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/kubernetes"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/test/lockapi"
)

// A replica that joins the Service must serve, from its first ready moment,
// what kube-apiserver forwards to it as the client who sent it, and from
// watch caches that hold the store's locks and sessions. Before its /readyz
// waited for both, a request forwarded the moment it was ready was anonymous
// (the front proxy's CA loads a moment after the server listens) and its
// lists went to etcd while the caches filled. lockapi.Start returns at the
// first /readyz that passes; nothing here waits or retries after it.
func TestAReplicaServesAsItsClientsOnceReady(t *testing.T) {
	ctx := t.Context()
	ns := namespace(t)
	alice, _, _ := lockClient(t, "alice", ns)
	for i := range 20 {
		l, err := alice.TryAcquire(ctx, fmt.Sprintf("cached-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Release(context.Background()) })
	}

	replica, err := lockapi.Start(ctx, env, bin, t.TempDir(), lockapi.Options{Name: "joining", Store: server.Etcd})
	if replica != nil {
		t.Cleanup(func() { _ = replica.Stop() })
	}
	if err != nil {
		t.Fatal(err)
	}

	// As kube-apiserver forwards a request: its front-proxy certificate, the
	// user in headers.
	forwarded := forwardedAs(t, replica, "system:admin", "system:masters")
	status, body := forwarded("/apis/" + locksv1alpha1.GroupVersion.String() + "/namespaces/" + ns + "/distributedlocks")
	if status != http.StatusOK {
		t.Errorf("a forwarded list on the replica's first ready moment: %d %s", status, body)
	}
	// A direct client with a certificate of the cluster's CA.
	direct, err := kubernetes.NewForConfig(replica.Direct(env.Config))
	if err != nil {
		t.Fatal(err)
	}
	metrics, err := direct.RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		t.Fatalf("a direct certificate client: %v: %s", err, metrics)
	}
	readyz, err := direct.RESTClient().Get().AbsPath("/readyz").Param("verbose", "true").DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, check := range []string{"poststarthook/storage-readiness", "poststarthook/authentication-ca"} {
		if !strings.Contains(string(readyz), "[+]"+check+" ok") {
			t.Errorf("/readyz does not wait for %s:\n%s", check, readyz)
		}
	}
	inits := cacheInitializations(t, metrics)
	for _, resource := range []string{"distributedlocks", "locksessions"} {
		if inits[resource] < 1 {
			t.Errorf("the replica was ready before its watch cache of %s was filled (initialisations: %v)", resource, inits)
		}
	}
}

// forwardedAs sends GETs to replica as kube-apiserver's aggregator forwards
// a request of user in groups.
func forwardedAs(t *testing.T, replica *lockapi.Server, user string, groups ...string) func(path string) (int, string) {
	t.Helper()
	cert, err := env.Cluster.FrontProxyClientCert()
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(replica.CA)
	// Sent whatever CAs the server's certificate request names, as
	// kube-apiserver's proxy does (client-go's GetClientCertificate).
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil },
		RootCAs:              roots, MinVersion: tls.VersionTLS12,
	}}}
	t.Cleanup(hc.CloseIdleConnections)
	return func(path string) (int, string) {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, replica.URL()+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Remote-User", user)
		for _, g := range groups {
			req.Header.Add("X-Remote-Group", g)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return resp.StatusCode, string(body)
	}
}

// cacheInitializations is apiserver_watch_cache_initializations_total of the
// lock group, by resource.
func cacheInitializations(t *testing.T, metrics []byte) map[string]float64 {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	parsed, err := parser.TextToMetricFamilies(bytes.NewReader(metrics))
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]float64{}
	for _, m := range parsed["apiserver_watch_cache_initializations_total"].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["group"] == locksv1alpha1.GroupVersion.Group {
			n[labels["resource"]] += m.GetCounter().GetValue()
		}
	}
	return n
}
