package operator

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/kubelock/kubelock/test/lockapi"
)

// TestLockAPIServerCertificateIssuedBeforeTheLockAPI: with
// --lock-apiserver-service-name and no lock API served yet (no CRDs, no
// kubelock-apiserver), the operator issues kubelock-apiserver's serving
// certificate into its Secret and the APIService's caBundle, and keeps waiting
// for the lock API instead of failing: kube-apiserver serves it only once
// kubelock-apiserver has that certificate.
func TestLockAPIServerCertificateIssuedBeforeTheLockAPI(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane")
	}
	if inOwnProcess(t) {
		return
	}
	logs := &syncBuffer{}
	ctrl.SetLogger(zap.New(zap.WriteTo(logs), zap.UseDevMode(true)))
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(logs.String())
		}
	})
	env, err := lockapi.ControlPlane()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	opts := DefaultOptions()
	opts.MetricsAddr, opts.ProbeAddr, opts.EnableWebhook = "0", "0", false
	opts.LeaderElectionNamespace = "default"
	opts.LockAPIServerServiceName = "kubelock-apiserver"
	opts.LockAPIServerCertDir = filepath.Join(t.TempDir(), "serving-certs")
	// What the chart ships: the empty Secret and the APIService without a caBundle.
	must(t, env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: opts.CertSecretNamespace}}))
	must(t, env.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: opts.CertSecretNamespace, Name: opts.LockAPIServerCertSecretName}}))
	as := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
		"metadata": map[string]any{"name": LockAPIServiceName},
		"spec": map[string]any{"group": "locks.kubelock.io", "version": "v1alpha1", "groupPriorityMinimum": int64(1000), "versionPriority": int64(15),
			"service": map[string]any{"namespace": opts.CertSecretNamespace, "name": opts.LockAPIServerServiceName, "port": int64(443)}},
	}}
	must(t, env.Client.Create(ctx, as))

	done := make(chan error, 1)
	go func() { done <- Run(ctx, env.Config, opts) }()
	secret := &corev1.Secret{}
	var caBundle string
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		select {
		case err := <-done:
			t.Fatalf("the operator stopped while it should wait for the lock API: %v", err)
		default:
		}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: opts.CertSecretNamespace, Name: opts.LockAPIServerCertSecretName}, secret); err != nil {
			return false, err
		}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(as), as); err != nil {
			return false, err
		}
		caBundle, _, _ = unstructured.NestedString(as.Object, "spec", "caBundle")
		return len(secret.Data[certName]) > 0 && caBundle != "", nil
	}); err != nil {
		t.Fatalf("the lock apiserver's certificate and the APIService's caBundle: %v", err)
	}

	ca, err := base64.StdEncoding.DecodeString(caBundle)
	must(t, err)
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(ca) {
		t.Fatalf("the APIService's caBundle holds no certificate: %q", ca)
	}
	block, _ := pem.Decode(secret.Data[certName])
	if block == nil {
		t.Fatal("the Secret's tls.crt is not PEM")
	}
	crt, err := x509.ParseCertificate(block.Bytes)
	must(t, err)
	// kube-apiserver dials the Service by this name and checks it against the caBundle.
	name := "kubelock-apiserver." + opts.CertSecretNamespace + ".svc"
	if _, err := crt.Verify(x509.VerifyOptions{DNSName: name, Roots: roots}); err != nil {
		t.Errorf("the certificate (for %v) does not verify for %s against the APIService's caBundle: %v", crt.DNSNames, name, err)
	}
	if !slices.Contains(crt.DNSNames, name+".cluster.local") {
		t.Errorf("the certificate is for %v, want %s.cluster.local too", crt.DNSNames, name)
	}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		copied, err := os.ReadFile(filepath.Join(opts.LockAPIServerCertDir, certName))
		return err == nil && bytes.Equal(copied, secret.Data[certName]), nil
	}); err != nil {
		t.Errorf("the operator's copy in %s: %v", opts.LockAPIServerCertDir, err)
	}
	select {
	case err := <-done:
		t.Fatalf("the operator stopped while it should wait for the lock API: %v", err)
	default:
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run after cancel: %v", err)
	}
}
