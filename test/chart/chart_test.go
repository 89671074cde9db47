// Package chart tests the Helm chart in dist/chart: helm lint and helm template
// with each values variant, the rendered objects against `kubectl kustomize`
// of config/ with the matching components, and a server-side dry run of every
// variant on the real apiserver.
package chart

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kubelock/kubelock/test/lockapi"
	"github.com/kubelock/kubelock/test/testenv"
)

// A variant is one set of values, the config/ overlay it must equal, and
// what the values change beyond that overlay.
type variant struct {
	name string
	// set: helm --set values; namespace: helm --namespace ("" is default).
	set       []string
	namespace string
	// components of config/ whose overlay of config/default the chart must
	// render, object for object; nil: the variant has no such overlay.
	components []string
	// except: objects (Kind/name) of that overlay not compared, and why;
	// check asserts what the chart renders for them instead.
	except map[string]string
	check  func(t *testing.T, r *rendered)
}

var variants = []variant{
	{
		// The chart elects on a DistributedLock by default; config/default
		// keeps the Lease, and its election-kubelock component switches.
		name:       "default",
		components: []string{"election-kubelock"},
		check: func(t *testing.T, r *rendered) {
			// The chart's own additions, which the comparison normalises away.
			crd := r.must(t, "CustomResourceDefinition/distributedlocks.locks.kubelock.io")
			if got := crd.GetAnnotations()["helm.sh/resource-policy"]; got != "keep" {
				t.Errorf("CRD annotation helm.sh/resource-policy = %q, want keep (crd.keep)", got)
			}
			if got := crd.GetLabels()["app.kubernetes.io/managed-by"]; got != "Helm" {
				t.Errorf("CRD label app.kubernetes.io/managed-by = %q, want Helm", got)
			}
		},
	},
	{
		name:       "cert-manager",
		set:        []string{"certManager.enable=true"},
		components: []string{"election-kubelock", "certmanager"},
	},
	{
		name:       "fenced-objects+apf+prometheus",
		set:        []string{"fencedObjects.enable=true", "apf.enable=true", "prometheus.serviceMonitor.enable=true", "prometheus.rule.enable=true"},
		components: []string{"election-kubelock", "fenced-objects", "apf", "prometheus"},
		check: func(t *testing.T, r *rendered) {
			// Prometheus' own template braces reach the PrometheusRule unexpanded.
			if !strings.Contains(r.text, "{{ $value | humanize }}") {
				t.Error("the PrometheusRule lost its {{ $value | humanize }} alert templates")
			}
		},
	},
	{
		// A Lease with client-go's timings: the kubelock election's do not follow it.
		name:       "leader election on a Lease",
		set:        []string{"manager.leaderElection.lock=lease"},
		components: []string{},
		check: func(t *testing.T, r *rendered) {
			flags := managerFlags(t, r.must(t, "Deployment/kubelock-controller-manager"))
			checkFlags(t, flags, map[string]string{"--leader-election-lock": "lease"})
			for _, f := range []string{"--leader-election-lease-duration", "--leader-election-renew-deadline", "--leader-election-retry-period"} {
				if _, ok := flags[f]; ok {
					t.Errorf("manager flags %v: %s with a Lease and no timing set", flags, f)
				}
			}
		},
	},
	{
		name:       "policy",
		set:        []string{"admission.engine=policy"},
		components: []string{"election-kubelock", "policy"},
		except: map[string]string{
			"ValidatingWebhookConfiguration/kubelock-validating-webhook-configuration": "the policy engine replaces the lock webhook",
			"Service/kubelock-webhook-service":                                         "nothing serves a webhook",
			"Secret/kubelock-webhook-server-cert":                                      "nothing serves a webhook",
			"RoleBinding/kubelock-cert-rotation":                                       "nothing serves a webhook",
			"Deployment/kubelock-controller-manager":                                   "the operator runs without its webhook server",
		},
		check: func(t *testing.T, r *rendered) {
			for _, gone := range []string{"ValidatingWebhookConfiguration/kubelock-validating-webhook-configuration",
				"Service/kubelock-webhook-service", "Secret/kubelock-webhook-server-cert", "RoleBinding/kubelock-cert-rotation"} {
				r.mustNot(t, gone)
			}
			d := r.must(t, "Deployment/kubelock-controller-manager")
			flags := managerFlags(t, d)
			if flags["--enable-webhook"] != "false" {
				t.Errorf("manager flags %v: want --enable-webhook=false", flags)
			}
			for _, f := range []string{"--webhook-port", "--cert-rotation", "--webhook-config-name"} {
				if _, ok := flags[f]; ok {
					t.Errorf("manager flags %v: %s without a webhook server", flags, f)
				}
			}
			if vols, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "volumes"); len(vols) != 0 {
				t.Errorf("volumes %v without a webhook server", vols)
			}
		},
	},
	{
		name:       "policy+fenced-objects",
		set:        []string{"admission.engine=policy", "fencedObjects.enable=true"},
		components: []string{"election-kubelock", "policy", "fenced-objects"},
		except: map[string]string{
			"ValidatingWebhookConfiguration/kubelock-validating-webhook-configuration": "the policy engine replaces the lock webhook",
			"Deployment/kubelock-controller-manager":                                   "the rotated certificate's caBundle goes to the fenced-objects webhook",
		},
		check: func(t *testing.T, r *rendered) {
			r.mustNot(t, "ValidatingWebhookConfiguration/kubelock-validating-webhook-configuration")
			want := map[string]string{"--enable-webhook": "true", "--cert-rotation": "true",
				"--webhook-config-name": "kubelock-fenced-objects", "--fenced-webhook-config-name": ""}
			checkFlags(t, managerFlags(t, r.must(t, "Deployment/kubelock-controller-manager")), want)
		},
	},
	{
		name:       "policy+fenced-objects+cert-manager",
		set:        []string{"admission.engine=policy", "fencedObjects.enable=true", "certManager.enable=true"},
		components: []string{"election-kubelock", "certmanager", "policy", "fenced-objects"},
		except: map[string]string{
			"ValidatingWebhookConfiguration/kubelock-validating-webhook-configuration": "the policy engine replaces the lock webhook",
			"Deployment/kubelock-controller-manager":                                   "names the fenced-objects webhook (no effect with cert-manager)",
		},
		check: func(t *testing.T, r *rendered) {
			r.mustNot(t, "ValidatingWebhookConfiguration/kubelock-validating-webhook-configuration")
			checkFlags(t, managerFlags(t, r.must(t, "Deployment/kubelock-controller-manager")),
				map[string]string{"--enable-webhook": "true", "--cert-rotation": "false"})
			r.must(t, "Certificate/kubelock-serving-cert")
		},
	},
	{
		name: "apiserver backend without lock server discovery",
		set:  []string{"backend=apiserver", "apiserver.lockServerDiscovery=false"},
		check: func(t *testing.T, r *rendered) {
			checkLockServerDiscovery(t, r, false)
		},
	},
	{
		// No overlay of config/ has the apiserver backend: each object is checked here.
		name: "apiserver backend",
		set:  []string{"backend=apiserver"},
		check: func(t *testing.T, r *rendered) {
			for _, gone := range []string{
				"CustomResourceDefinition/distributedlocks.locks.kubelock.io", "CustomResourceDefinition/locksessions.locks.kubelock.io",
				"ValidatingWebhookConfiguration/kubelock-validating-webhook-configuration", "Service/kubelock-webhook-service",
				"Certificate/kubelock-apiserver-cert", "ServiceMonitor/kubelock-apiserver", "PrometheusRule/kubelock-apiserver-alerts",
			} {
				r.mustNot(t, gone)
			}
			checkAPIService(t, r, false)
			checkDelegatedAuth(t, r)
			checkAPIServerDeployment(t, r, 2, []string{
				"http://kubelock-etcd-0.kubelock-etcd.kubelock-system.svc:2379",
				"http://kubelock-etcd-1.kubelock-etcd.kubelock-system.svc:2379",
				"http://kubelock-etcd-2.kubelock-etcd.kubelock-system.svc:2379",
			})
			checkEtcd(t, r, 3, "8Gi", "")
			r.must(t, "PodDisruptionBudget/kubelock-apiserver")
			r.must(t, "NetworkPolicy/kubelock-etcd")
			checkLockServerDiscovery(t, r, true)
			// The operator rotates the lock apiserver's certificate: no webhook
			// server of its own, but the Secret, its rights and the flags.
			r.must(t, "Secret/kubelock-apiserver-cert")
			r.must(t, "RoleBinding/kubelock-apiserver-cert-rotation")
			r.must(t, "ClusterRoleBinding/kubelock-apiserver-cert-rotation")
			checkFlags(t, managerFlags(t, r.must(t, "Deployment/kubelock-controller-manager")), map[string]string{
				"--enable-webhook": "false", "--cert-rotation": "true", "--cert-secret-namespace": "$(POD_NAMESPACE)",
				"--lock-apiserver-service-name": "kubelock-apiserver", "--lock-apiserver-cert-secret-name": "kubelock-apiserver-cert",
				"--lock-apiserver-cert-dir": "/tmp/kubelock-apiserver/serving-certs",
			})
		},
	},
	{
		name: "apiserver backend+fenced-objects+cert-manager",
		set:  []string{"backend=apiserver", "fencedObjects.enable=true", "certManager.enable=true"},
		check: func(t *testing.T, r *rendered) {
			r.mustNot(t, "ValidatingWebhookConfiguration/kubelock-validating-webhook-configuration")
			r.mustNot(t, "Secret/kubelock-apiserver-cert")
			r.mustNot(t, "ClusterRoleBinding/kubelock-apiserver-cert-rotation")
			// The webhook serves fenced objects only; cert-manager issues both certificates.
			r.must(t, "ValidatingWebhookConfiguration/kubelock-fenced-objects")
			r.must(t, "Issuer/kubelock-selfsigned-issuer")
			r.must(t, "Certificate/kubelock-serving-cert")
			cert := r.must(t, "Certificate/kubelock-apiserver-cert")
			if names, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames"); !slices.Contains(names, "kubelock-apiserver.kubelock-system.svc") {
				t.Errorf("the lock apiserver's Certificate is for %v, want kubelock-apiserver.kubelock-system.svc", names)
			}
			// Issued by a CA of its own, so that the caBundle clients read
			// stays the same when the serving certificate is renewed.
			if issuer, _, _ := unstructured.NestedString(cert.Object, "spec", "issuerRef", "name"); issuer != "kubelock-apiserver-ca" {
				t.Errorf("the lock apiserver's Certificate is issued by %q, want its CA's Issuer kubelock-apiserver-ca", issuer)
			}
			caSecret, _, _ := unstructured.NestedString(r.must(t, "Issuer/kubelock-apiserver-ca").Object, "spec", "ca", "secretName")
			ca := r.must(t, "Certificate/kubelock-apiserver-ca").Object
			isCA, _, _ := unstructured.NestedBool(ca, "spec", "isCA")
			secret, _, _ := unstructured.NestedString(ca, "spec", "secretName")
			rotation, _, _ := unstructured.NestedString(ca, "spec", "privateKey", "rotationPolicy")
			// Renewed with the same key, so that a caBundle read before
			// the CA's renewal keeps verifying what it issues after.
			if !isCA || secret != caSecret || rotation != "Never" {
				t.Errorf("Certificate/kubelock-apiserver-ca: isCA %v, secret %q (the Issuer's %q), key rotation %q; want a CA in the Issuer's Secret, its key kept", isCA, secret, caSecret, rotation)
			}
			checkAPIService(t, r, true)
			flags := managerFlags(t, r.must(t, "Deployment/kubelock-controller-manager"))
			checkFlags(t, flags, map[string]string{"--enable-webhook": "true", "--cert-rotation": "false",
				"--webhook-config-name": "kubelock-fenced-objects", "--fenced-webhook-config-name": ""})
			// It waits for the lock API, and rotates no certificate of the lock apiserver's.
			checkFlags(t, flags, map[string]string{"--lock-apiserver-service-name": "kubelock-apiserver"})
			if _, ok := flags["--lock-apiserver-cert-secret-name"]; ok {
				t.Errorf("manager flags %v: the operator rotates the lock apiserver's certificate although cert-manager issues it", flags)
			}
		},
	},
	{
		name: "apiserver backend tuned",
		set: []string{"backend=apiserver", "certManager.enable=true", "apiserver.replicas=3", "etcd.replicas=5",
			"etcd.persistence.storageClassName=zonal-ssd", "etcd.persistence.size=20Gi", "etcd.quotaBackendBytes=8589934592",
			"prometheus.serviceMonitor.enable=true", "prometheus.rule.enable=true"},
		check: func(t *testing.T, r *rendered) {
			checkEtcd(t, r, 5, "20Gi", "zonal-ssd")
			// The backend's own scrapes and alerts; the operator's too.
			for _, name := range []string{"kubelock-apiserver", "kubelock-etcd", "kubelock-controller-manager-metrics"} {
				r.must(t, "ServiceMonitor/"+name)
			}
			rule := r.must(t, "PrometheusRule/kubelock-apiserver-alerts")
			r.must(t, "PrometheusRule/kubelock-alerts")
			// The member count the store alert compares with is the release's.
			if raw, _ := json.Marshal(rule.Object); !strings.Contains(string(raw), `count(up{job=\"kubelock-etcd-client\"} == 1) \u003c 5`) {
				t.Errorf("the lock store's member alert does not compare with etcd.replicas=5:\n%s", raw)
			}
			d := r.must(t, "Deployment/kubelock-apiserver")
			if replicas, _, _ := unstructured.NestedInt64(d.Object, "spec", "replicas"); replicas != 3 {
				t.Errorf("kubelock-apiserver has %d replicas, want 3", replicas)
			}
			if args := containerArgs(t, r.must(t, "StatefulSet/kubelock-etcd")); !slices.Contains(args, "--quota-backend-bytes=8589934592") {
				t.Errorf("etcd args %v lack --quota-backend-bytes=8589934592", args)
			}
			// cert-manager without a webhook server: the operator's own
			// rotation (on by default) must be turned off.
			checkFlags(t, managerFlags(t, r.must(t, "Deployment/kubelock-controller-manager")),
				map[string]string{"--enable-webhook": "false", "--cert-rotation": "false", "--lock-apiserver-service-name": "kubelock-apiserver"})
		},
	},
	{
		// A cluster without DNS (kubelock-dev --node): one member on its pod IP.
		name: "apiserver backend without cluster DNS",
		set:  []string{"backend=apiserver", "etcd.clusterDNS=false", "etcd.replicas=1", "etcd.persistence.enable=false"},
		check: func(t *testing.T, r *rendered) {
			checkAPIServerDeployment(t, r, 2, []string{"http://$(KUBELOCK_ETCD_CLIENT_SERVICE_HOST):2379"})
			sts := r.must(t, "StatefulSet/kubelock-etcd")
			if _, found, _ := unstructured.NestedSlice(sts.Object, "spec", "volumeClaimTemplates"); found {
				t.Error("etcd.persistence.enable=false: the StatefulSet still claims volumes")
			}
			if args := containerArgs(t, sts); !slices.Contains(args, "--initial-cluster=$(POD_NAME)=http://$(POD_IP):2380") {
				t.Errorf("etcd args %v: want the member on its pod IP", args)
			}
			r.must(t, "Service/kubelock-etcd-client")
		},
	},
	{
		// No overlay of config/ has these: each value is checked where it lands.
		name:      "tuned-in-release-namespace",
		namespace: "kubelock-tuned",
		set: []string{
			"namespace.name=", "namespace.create=false", "crd.keep=false",
			"manager.replicas=3", "manager.image.repository=registry.example/kubelock/manager", "manager.image.tag=v9.9.9",
			"manager.image.pullPolicy=IfNotPresent", "manager.resources.limits.memory=2Gi",
			"manager.leaderElection.leaseDuration=30s", "manager.leaderElection.renewDeadline=20s", "manager.leaderElection.retryPeriod=4s",
			"manager.expiryGrace=5s", "manager.events=all", "manager.extraArgs={--concurrency=8}", "manager.podDisruptionBudget.enable=false",
			"rbac.breakglass.enable=false", "admission.engine=policy", "fencedObjects.enable=true", "certManager.enable=true",
			"apf.enable=true", "prometheus.serviceMonitor.enable=true",
		},
		check: func(t *testing.T, r *rendered) {
			// Every namespace config/ names (metadata, Service references, the
			// policies' controller user, cert-manager's DNS names and CA
			// injection, the APF subject) follows the release's.
			if strings.Contains(r.text, "kubelock-system") {
				t.Errorf("kubelock-system left in a chart installed into kubelock-tuned:\n%s", grepLines(r.text, "kubelock-system"))
			}
			for _, want := range []string{
				"'system:serviceaccount:kubelock-tuned:kubelock-controller-manager'",
				"kubelock-webhook-service.kubelock-tuned.svc",
				"cert-manager.io/inject-ca-from: kubelock-tuned/kubelock-serving-cert",
			} {
				if !strings.Contains(r.text, want) {
					t.Errorf("the render lacks %q", want)
				}
			}
			for _, gone := range []string{"Namespace/kubelock-tuned", "ClusterRole/kubelock-breakglass", "PodDisruptionBudget/kubelock-controller-manager"} {
				r.mustNot(t, gone)
			}
			if _, ok := r.must(t, "CustomResourceDefinition/distributedlocks.locks.kubelock.io").GetAnnotations()["helm.sh/resource-policy"]; ok {
				t.Error("crd.keep=false: the CRD still has helm.sh/resource-policy")
			}
			d := r.must(t, "Deployment/kubelock-controller-manager")
			if d.GetNamespace() != "kubelock-tuned" {
				t.Errorf("Deployment in namespace %q, want kubelock-tuned", d.GetNamespace())
			}
			replicas, _, _ := unstructured.NestedInt64(d.Object, "spec", "replicas")
			containers, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
			c, _ := containers[0].(map[string]any)
			memory, _, _ := unstructured.NestedString(c, "resources", "limits", "memory")
			cpu, _, _ := unstructured.NestedString(c, "resources", "requests", "cpu")
			got := fmt.Sprintf("replicas %d, image %v (%v), limits.memory %s, requests.cpu %s", replicas, c["image"], c["imagePullPolicy"], memory, cpu)
			if want := "replicas 3, image registry.example/kubelock/manager:v9.9.9 (IfNotPresent), limits.memory 2Gi, requests.cpu 100m"; got != want {
				t.Errorf("Deployment: %s, want %s", got, want)
			}
			checkFlags(t, managerFlags(t, d), map[string]string{
				"--leader-election-lease-duration": "30s", "--leader-election-renew-deadline": "20s",
				"--leader-election-retry-period": "4s", "--expiry-grace": "5s", "--events": "all", "--concurrency": "8",
			})
		},
	},
}

// TestChart lints and renders the chart with each variant, compares the
// objects with config/'s, and dry-runs each render on one real apiserver.
func TestChart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane")
	}
	h := newHarness(t)
	withCRDs := startControlPlane(t, testenv.Start)
	// The apiserver backend's own: without the lock CRDs, whose APIService
	// kube-apiserver would own (a group version is served by one or the other).
	noCRDs := startControlPlane(t, lockapi.ControlPlane)

	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			args := append([]string{}, v.set...)
			h.helm(t, "lint", v.namespace, args)
			r := h.template(t, v.namespace, args)

			if v.components != nil {
				want := h.kustomize(t, v.components)
				compare(t, want, r, v.except)
			}
			if v.check != nil {
				v.check(t, r)
			}
			on := withCRDs
			if slices.Contains(v.set, "backend=apiserver") {
				on = noCRDs
			}
			dryRun(t, on.kubectl, r.text, len(r.order))
		})
	}
	t.Run("refuses the other backend", func(t *testing.T) {
		refusesTheOtherBackend(t, h, withCRDs, noCRDs)
	})
}

// refusesTheOtherBackend: an install or upgrade that reads the cluster
// (helm's lookup, as install, upgrade and --dry-run=server do) refuses
// backend=apiserver while the lock CRD exists, and backend=crd while the
// APIService names kubelock-apiserver's Service, and says why and how to
// switch; each backend renders where the other is not installed.
func refusesTheOtherBackend(t *testing.T, h *harness, withCRDs, noCRDs *plane) {
	// The planes hold the namespace, and the first the lock CRDs, outside
	// any release: helm would refuse to adopt them.
	render := func(p *plane, backend string, set ...string) (string, error) {
		args := []string{"template", "kubelock", h.chart, "--namespace", "kubelock-system", "--dry-run=server",
			"--kubeconfig", p.kubeconfig, "--set", "namespace.create=false", "--set", "backend=" + backend}
		for _, s := range set {
			args = append(args, "--set", s)
		}
		return h.run(args...)
	}
	refused := func(p *plane, backend, want string) {
		t.Helper()
		out, err := render(p, backend)
		if err == nil {
			t.Errorf("backend=%s rendered with the other backend installed; want it refused", backend)
			return
		}
		for _, w := range []string{want, "never both", "locks are never carried across", "Switching a cluster's backend"} {
			if !strings.Contains(out, w) {
				t.Errorf("backend=%s: the refusal does not say %q:\n%s", backend, w, out)
			}
		}
	}
	rendered := func(p *plane, backend string, set ...string) {
		t.Helper()
		if out, err := render(p, backend, set...); err != nil {
			t.Errorf("backend=%s where the other backend is not installed: %v\n%s", backend, err, out)
		}
	}

	rendered(withCRDs, "crd", "crd.enable=false")
	refused(withCRDs, "apiserver", "the CRD distributedlocks.locks.kubelock.io exists in this cluster (the crd backend)")

	rendered(noCRDs, "apiserver")
	rendered(noCRDs, "crd")
	apiService := filepath.Join(t.TempDir(), "apiservice.yaml")
	if err := os.WriteFile(apiService, []byte(`apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata:
  name: v1alpha1.locks.kubelock.io
spec:
  group: locks.kubelock.io
  version: v1alpha1
  groupPriorityMinimum: 1000
  versionPriority: 15
  service: {name: kubelock-apiserver, namespace: kubelock-system, port: 443}
  insecureSkipTLSVerify: true
`), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := noCRDs.kubectl("apply", "-f", apiService); err != nil {
		t.Fatalf("the apiserver backend's APIService: %v\n%s", err, out)
	}
	t.Cleanup(func() { _, _ = noCRDs.kubectl("delete", "-f", apiService) })
	refused(noCRDs, "crd", "the APIService v1alpha1.locks.kubelock.io names the Service kubelock-system/kubelock-apiserver (kubelock-apiserver, the apiserver backend)")
}

// TestChartRejectsBadValues: values.schema.json refuses what the templates
// would turn into a broken operator, and says which value; the templates
// refuse combinations of values, and say why.
func TestChartRejectsBadValues(t *testing.T) {
	h := newHarness(t)
	for _, c := range []struct{ set, want string }{
		{"admission.engine=both", "/admission/engine"},
		{"manager.leaderElection.leaseDuration=15", "/manager/leaderElection/leaseDuration"},
		{"manager.leaderElection.lock=configmap", "/manager/leaderElection/lock"},
		{"manager.expiryGrace=soon", "/manager/expiryGrace"},
		{"manager.events=none", "/manager/events"},
		{"manager.replicaz=2", "replicaz"},
		{"namespace.name=Kubelock_System", "/namespace/name"},
		{"backend=etcd", "/backend"},
		{"etcd.persistence.size=lots", "/etcd/persistence/size"},
		{"apiserver.storageEncoding=protobuf", "/apiserver/storageEncoding"},
	} {
		out, err := h.run("lint", "--strict", h.chart, "--set", c.set)
		if err == nil {
			t.Errorf("helm lint --set %s passed; want a schema error naming %s", c.set, c.want)
			continue
		}
		if !strings.Contains(out, c.want) {
			t.Errorf("helm lint --set %s: the error does not name %s:\n%s", c.set, c.want, out)
		}
	}
}

// TestChartRefusesCombinations: the templates refuse combinations of values
// the schema cannot see, and say why.
func TestChartRefusesCombinations(t *testing.T) {
	h := newHarness(t)
	for _, c := range []struct{ set, want string }{
		{"backend=apiserver,admission.engine=policy", "backend=apiserver with admission.engine=policy: kubelock-apiserver runs kubelock's admission rules itself, and ValidatingAdmissionPolicies never see its writes"},
		{"backend=apiserver,etcd.clusterDNS=false", "etcd.clusterDNS=false with etcd.replicas=3: without cluster DNS the members cannot find each other"},
	} {
		out, err := h.run("template", "kubelock", h.chart, "--set", c.set)
		if err == nil {
			t.Errorf("helm template --set %s rendered; want it refused", c.set)
			continue
		}
		if !strings.Contains(out, c.want) {
			t.Errorf("helm template --set %s: the error does not say %q:\n%s", c.set, c.want, out)
		}
	}
}

// harness: the helm binary, the chart, the repository.
type harness struct {
	helmPath, chart, root string
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	root := testenv.RepoRoot()
	path, err := testenv.Helm()
	if err != nil {
		t.Fatal(err)
	}
	return &harness{helmPath: path, chart: filepath.Join(root, "dist", "chart"), root: root}
}

func (h *harness) run(args ...string) (string, error) {
	cmd := exec.Command(h.helmPath, args...)
	// helm keeps no state here: repositories, cache and config are not used.
	dir, err := os.MkdirTemp("", "helm-home-")
	if err != nil {
		return "", err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+dir, "HELM_CONFIG_HOME="+dir, "HELM_DATA_HOME="+dir)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// helm runs `helm lint --strict` with the values.
func (h *harness) helm(t *testing.T, verb, namespace string, set []string) {
	t.Helper()
	args := []string{verb, "--strict", h.chart}
	if namespace != "" {
		args = append(args, "--namespace", namespace)
	}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	out, err := h.run(args...)
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("helm %s: %s", verb, lastLine(out))
}

// rendered is one render: its text and its objects by Kind/name.
type rendered struct {
	text    string
	objects map[string]*unstructured.Unstructured
	order   []string
}

func (r *rendered) must(t *testing.T, key string) *unstructured.Unstructured {
	t.Helper()
	o, ok := r.objects[key]
	if !ok {
		t.Fatalf("the render has no %s; it has %v", key, r.order)
	}
	return o
}

func (r *rendered) mustNot(t *testing.T, key string) {
	t.Helper()
	if _, ok := r.objects[key]; ok {
		t.Errorf("the render has %s", key)
	}
}

func (h *harness) template(t *testing.T, namespace string, set []string) *rendered {
	t.Helper()
	args := []string{"template", "kubelock", h.chart}
	if namespace != "" {
		args = append(args, "--namespace", namespace)
	}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	cmd := exec.Command(h.helmPath, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return parse(t, "helm template", out)
}

// kustomize renders config/default with the given components, as a user's
// overlay would, with the control plane's kubectl.
func (h *harness) kustomize(t *testing.T, components []string) *rendered {
	t.Helper()
	dir := filepath.Join(h.root, "config", "default")
	if len(components) > 0 {
		dir = t.TempDir()
		rel := func(p string) string {
			r, err := filepath.Rel(dir, filepath.Join(h.root, "config", p))
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		k := "resources:\n- " + rel("default") + "\ncomponents:\n"
		for _, c := range components {
			k += "- " + rel(c) + "\n"
		}
		if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command(kubectlPath(t), "kustomize", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize config/default with %v: %v\n%s", components, err, out)
	}
	return parse(t, "kubectl kustomize", out)
}

func kubectlPath(t *testing.T) string {
	t.Helper()
	p := filepath.Join(testenv.AssetsDir(), "kubectl")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("no kubectl in the control-plane build (make control-plane): %v", err)
	}
	return p
}

func parse(t *testing.T, what string, text []byte) *rendered {
	t.Helper()
	r := &rendered{text: string(text), objects: map[string]*unstructured.Unstructured{}}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(text), 4096)
	for {
		var doc json.RawMessage
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if d := bytes.TrimSpace(doc); len(d) == 0 || bytes.Equal(d, []byte("null")) || bytes.Equal(d, []byte("{}")) {
			continue
		}
		// Unstructured's own decoding keeps integers int64.
		o := &unstructured.Unstructured{}
		if err := o.UnmarshalJSON(doc); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		key := o.GetKind() + "/" + o.GetName()
		if _, dup := r.objects[key]; dup {
			t.Fatalf("%s renders %s twice", what, key)
		}
		r.objects[key] = o
		r.order = append(r.order, key)
	}
	sort.Strings(r.order)
	return r
}

// helmLabels are what the chart adds to every object's labels; the
// comparison with config/ removes them, and nothing else of the chart's.
var helmLabels = []string{"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "app.kubernetes.io/version"}

// normalise removes the chart's own metadata, which config/ does not have
// (helmLabels, and helm.sh/resource-policy: keep on the CRDs), and replaces
// the manager's args by the flags they set (the last of a repeated flag wins,
// as the operator parses them; config/certmanager can only append
// --cert-rotation=false where the chart sets it in place).
func normalise(t *testing.T, o *unstructured.Unstructured) map[string]any {
	t.Helper()
	c := o.DeepCopy()
	if labels := c.GetLabels(); labels != nil {
		for _, l := range helmLabels {
			delete(labels, l)
		}
		if len(labels) == 0 {
			labels = nil // config/ may have no labels at all
		}
		c.SetLabels(labels)
	}
	if c.GetKind() == "CustomResourceDefinition" {
		if a := c.GetAnnotations(); a != nil {
			delete(a, "helm.sh/resource-policy")
			c.SetAnnotations(a)
		}
	}
	if c.GetKind() == "Deployment" {
		containers, _, _ := unstructured.NestedSlice(c.Object, "spec", "template", "spec", "containers")
		for i := range containers {
			ct, _ := containers[i].(map[string]any)
			if args, ok := ct["args"].([]any); ok {
				ct["args"] = effectiveFlags(args)
			}
		}
		if err := unstructured.SetNestedSlice(c.Object, containers, "spec", "template", "spec", "containers"); err != nil {
			t.Fatal(err)
		}
	}
	return c.Object
}

func effectiveFlags(args []any) []any {
	last := map[string]string{}
	for _, a := range args {
		s := fmt.Sprint(a)
		name, value, _ := strings.Cut(s, "=")
		last[name] = value
	}
	names := make([]string, 0, len(last))
	for n := range last {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]any, 0, len(names))
	for _, n := range names {
		out = append(out, n+"="+last[n])
	}
	return out
}

// compare holds the chart's render to config/'s: the same objects (by kind,
// namespace and name) with the same content once normalised, but for the
// objects in except, which are logged with the reason.
func compare(t *testing.T, want, got *rendered, except map[string]string) {
	t.Helper()
	keys := slices.Clone(want.order)
	for _, k := range got.order {
		if _, ok := want.objects[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	same := 0
	for _, k := range keys {
		if why, ok := except[k]; ok {
			t.Logf("not compared with config/: %s (%s)", k, why)
			continue
		}
		w, inConfig := want.objects[k]
		g, inChart := got.objects[k]
		switch {
		case !inChart:
			t.Errorf("config/ renders %s; the chart does not", k)
		case !inConfig:
			t.Errorf("the chart renders %s; config/ does not", k)
		case w.GetNamespace() != g.GetNamespace() || w.GetAPIVersion() != g.GetAPIVersion():
			t.Errorf("%s: config/ has %s in namespace %q, the chart %s in %q", k, w.GetAPIVersion(), w.GetNamespace(), g.GetAPIVersion(), g.GetNamespace())
		default:
			if d := cmp.Diff(normalise(t, w), normalise(t, g)); d != "" {
				t.Errorf("%s differs from config/ (-config/ +chart):\n%s", k, d)
			} else {
				same++
			}
		}
	}
	t.Logf("%d objects equal to config/'s (helm labels %v and the CRDs' helm.sh/resource-policy removed, manager args compared as flags)", same, helmLabels)
}

func managerFlags(t *testing.T, d *unstructured.Unstructured) map[string]string {
	t.Helper()
	containers, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	if len(containers) != 1 {
		t.Fatalf("Deployment has %d containers, want 1", len(containers))
	}
	c, _ := containers[0].(map[string]any)
	args, _ := c["args"].([]any)
	flags := map[string]string{}
	for _, a := range args {
		name, value, _ := strings.Cut(fmt.Sprint(a), "=")
		flags[name] = value
	}
	return flags
}

// checkAPIService: the lock API's APIService names kubelock-apiserver's
// Service and, with cert-manager, has its CA injected; never a skipped TLS check.
func checkAPIService(t *testing.T, r *rendered, certManager bool) {
	t.Helper()
	as := r.must(t, "APIService/v1alpha1.locks.kubelock.io")
	spec, _, _ := unstructured.NestedMap(as.Object, "spec")
	svc, _ := spec["service"].(map[string]any)
	got := fmt.Sprintf("%v/%v %v.%v:%v", spec["group"], spec["version"], svc["name"], svc["namespace"], svc["port"])
	if want := "locks.kubelock.io/v1alpha1 kubelock-apiserver.kubelock-system:443"; got != want {
		t.Errorf("APIService serves %s, want %s", got, want)
	}
	if skip, _ := spec["insecureSkipTLSVerify"].(bool); skip {
		t.Error("the APIService skips TLS verification")
	}
	inject := as.GetAnnotations()["cert-manager.io/inject-ca-from"]
	if want := map[bool]string{true: "kubelock-system/kubelock-apiserver-cert"}[certManager]; inject != want {
		t.Errorf("APIService annotation cert-manager.io/inject-ca-from = %q, want %q", inject, want)
	}
}

// checkDelegatedAuth: kubelock-apiserver's account may review tokens and
// access (system:auth-delegator) and read the front-proxy CA in kube-system.
func checkDelegatedAuth(t *testing.T, r *rendered) {
	t.Helper()
	for key, role := range map[string]string{
		"ClusterRoleBinding/kubelock-apiserver:system:auth-delegator": "ClusterRole/system:auth-delegator",
		"RoleBinding/kubelock-apiserver-auth-reader":                  "Role/extension-apiserver-authentication-reader",
	} {
		b := r.must(t, key)
		kind, _, _ := unstructured.NestedString(b.Object, "roleRef", "kind")
		name, _, _ := unstructured.NestedString(b.Object, "roleRef", "name")
		subjects, _, _ := unstructured.NestedSlice(b.Object, "subjects")
		if got := kind + "/" + name; got != role || len(subjects) != 1 || fmt.Sprint(subjects[0]) != "map[kind:ServiceAccount name:kubelock-apiserver namespace:kubelock-system]" {
			t.Errorf("%s binds %s to %v, want %s to the ServiceAccount kubelock-apiserver", key, got, subjects, role)
		}
	}
	if ns := r.must(t, "RoleBinding/kubelock-apiserver-auth-reader").GetNamespace(); ns != "kube-system" {
		t.Errorf("the authentication reader's RoleBinding is in %q, want kube-system", ns)
	}
}

// checkAPIServerDeployment: replicas spread like the manager's, the etcd
// members as --etcd-servers, the operator's account as the controller, and
// the certificate's Secret mounted.
func checkAPIServerDeployment(t *testing.T, r *rendered, replicas int64, etcd []string) {
	t.Helper()
	d := r.must(t, "Deployment/kubelock-apiserver")
	if got, _, _ := unstructured.NestedInt64(d.Object, "spec", "replicas"); got != replicas {
		t.Errorf("kubelock-apiserver has %d replicas, want %d", got, replicas)
	}
	if _, found, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "affinity", "podAntiAffinity", "preferredDuringSchedulingIgnoredDuringExecution"); !found {
		t.Error("kubelock-apiserver's replicas have no anti-affinity")
	}
	args := containerArgs(t, d)
	for _, want := range []string{"--etcd-servers=" + strings.Join(etcd, ","),
		"--controller-users=system:serviceaccount:kubelock-system:kubelock-controller-manager"} {
		if !slices.Contains(args, want) {
			t.Errorf("kubelock-apiserver args %v lack %s", args, want)
		}
	}
	pod := &corev1.PodSpec{}
	spec, _, _ := unstructured.NestedMap(d.Object, "spec", "template", "spec")
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(spec, pod); err != nil {
		t.Fatal(err)
	}
	// The serving certificate and its key, never the CA's key the
	// operator's rotation keeps in the same Secret.
	var keys []string
	if v := pod.Volumes; len(v) == 1 && v[0].Secret != nil && v[0].Secret.SecretName == "kubelock-apiserver-cert" {
		for _, item := range v[0].Secret.Items {
			keys = append(keys, item.Key)
		}
	}
	if !slices.Equal(keys, []string{"tls.crt", "tls.key"}) {
		t.Errorf("kubelock-apiserver's volumes %+v: want tls.crt and tls.key of the Secret kubelock-apiserver-cert", pod.Volumes)
	}
}

// checkEtcd: members started in parallel behind the headless Service, each
// with a claim of size (of storageClass, or the default), and a budget that
// keeps quorum.
func checkEtcd(t *testing.T, r *rendered, members int64, size, storageClass string) {
	t.Helper()
	sts := r.must(t, "StatefulSet/kubelock-etcd")
	spec, _, _ := unstructured.NestedMap(sts.Object, "spec")
	if spec["replicas"] != members || spec["podManagementPolicy"] != "Parallel" || spec["serviceName"] != "kubelock-etcd" {
		t.Errorf("etcd StatefulSet: replicas %v, podManagementPolicy %v, serviceName %v; want %d, Parallel, kubelock-etcd",
			spec["replicas"], spec["podManagementPolicy"], spec["serviceName"], members)
	}
	claims, _, _ := unstructured.NestedSlice(sts.Object, "spec", "volumeClaimTemplates")
	if len(claims) != 1 {
		t.Fatalf("etcd StatefulSet claims %v, want one volume", claims)
	}
	claim, _ := claims[0].(map[string]any)
	gotSize, _, _ := unstructured.NestedString(claim, "spec", "resources", "requests", "storage")
	gotClass, _, _ := unstructured.NestedString(claim, "spec", "storageClassName")
	if gotSize != size || gotClass != storageClass {
		t.Errorf("etcd claims %s of class %q, want %s of class %q", gotSize, gotClass, size, storageClass)
	}
	var peers string
	for _, a := range containerArgs(t, sts) {
		if v, ok := strings.CutPrefix(a, "--initial-cluster="); ok {
			peers = v
		}
	}
	if n := int64(strings.Count(peers, "=http://")); n != members {
		t.Errorf("etcd --initial-cluster=%s names %d members, want %d", peers, n, members)
	}
	if ip, _, _ := unstructured.NestedString(r.must(t, "Service/kubelock-etcd").Object, "spec", "clusterIP"); ip != "None" {
		t.Errorf("the members' Service has clusterIP %q, want None (headless)", ip)
	}
	if mu, _, _ := unstructured.NestedInt64(r.must(t, "PodDisruptionBudget/kubelock-etcd").Object, "spec", "maxUnavailable"); mu != 1 {
		t.Errorf("etcd's PodDisruptionBudget allows %d unavailable, want 1", mu)
	}
}

// containerArgs are the first container's args.
func containerArgs(t *testing.T, o *unstructured.Unstructured) []string {
	t.Helper()
	containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
	if len(containers) == 0 {
		t.Fatalf("%s %s has no containers", o.GetKind(), o.GetName())
	}
	c, _ := containers[0].(map[string]any)
	list, _ := c["args"].([]any)
	var args []string
	for _, a := range list {
		args = append(args, fmt.Sprint(a))
	}
	return args
}

func checkFlags(t *testing.T, flags, want map[string]string) {
	t.Helper()
	for name, value := range want {
		if got, ok := flags[name]; !ok || got != value {
			t.Errorf("manager flag %s = %q (set: %v), want %q", name, got, ok, value)
		}
	}
}

// plane is a control plane the chart's renders are checked on: a kubectl
// for an admin, and a kubeconfig of the same for helm.
type plane struct {
	kubectl    func(args ...string) (string, error)
	kubeconfig string
}

// startControlPlane starts etcd and kube-apiserver with start and adds what
// the dry runs need.
func startControlPlane(t *testing.T, start func(...testenv.Option) (*testenv.Env, error)) *plane {
	t.Helper()
	kubectlPath(t) // fails clearly when the control plane lacks kubectl
	env, err := start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	// A server-side dry run creates no namespace; the rest lives in these.
	for _, ns := range []string{"kubelock-system", "kubelock-tuned"} {
		if err := env.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	run, err := env.Kubectl("chart-admin")
	if err != nil {
		t.Fatal(err)
	}
	installStandInCRDs(t, run)
	helm, err := env.AddUser(envtest.User{Name: "chart-helm", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := helm.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(file, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	return &plane{kubectl: run, kubeconfig: file}
}

// standIns are the kinds of other projects' CRDs the chart can render:
// cert-manager's and the Prometheus Operator's.
var standIns = []struct{ group, kind, plural string }{
	{"cert-manager.io", "Issuer", "issuers"},
	{"cert-manager.io", "Certificate", "certificates"},
	{"monitoring.coreos.com", "ServiceMonitor", "servicemonitors"},
	{"monitoring.coreos.com", "PrometheusRule", "prometheusrules"},
}

// installStandInCRDs installs testenv.StandInCRD for each of standIns.
func installStandInCRDs(t *testing.T, kubectl func(args ...string) (string, error)) {
	t.Helper()
	var b strings.Builder
	names := []string{"--for=condition=Established", "--timeout=60s"}
	for _, s := range standIns {
		b.WriteString(testenv.StandInCRD(s.group, s.kind, s.plural))
		names = append(names, "crd/"+s.plural+"."+s.group)
		t.Logf("dry runs use a stand-in CRD for %s.%s/v1 (any spec): the apiserver checks those objects' metadata, not their spec", s.kind, s.group)
	}
	file := filepath.Join(t.TempDir(), "stand-in-crds.yaml")
	if err := os.WriteFile(file, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := kubectl("apply", "-f", file); err != nil {
		t.Fatalf("stand-in CRDs: %v\n%s", err, out)
	}
	if out, err := kubectl(append([]string{"wait"}, names...)...); err != nil {
		t.Fatalf("stand-in CRDs: %v\n%s", err, out)
	}
}

// dryRun applies a render with a server-side dry run: the apiserver validates
// every object (schemas, CEL of the policies, field names: kubectl's
// --validate=strict) and stores nothing.
func dryRun(t *testing.T, kubectl func(args ...string) (string, error), manifest string, objects int) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "chart.yaml")
	if err := os.WriteFile(file, []byte(manifest), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := kubectl("apply", "--server-side", "--dry-run=server", "--validate=strict", "-f", file)
	if err != nil {
		t.Fatalf("the apiserver rejects the render: %v\n%s", err, out)
	}
	if n := strings.Count(out, "(server dry run)"); n != objects {
		t.Fatalf("the server-side dry run accepted %d objects of %d:\n%s", n, objects, out)
	}
	t.Logf("server-side dry run: all %d objects accepted", objects)
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

func grepLines(text, s string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// checkLockServerDiscovery checks what the chart grants every authenticated
// user so that clients can find the lock server (--lock-server=auto): get on
// the lock API's APIService and on kubelock-apiserver's Service, each by
// name, and nothing else; or nothing when want is false.
func checkLockServerDiscovery(t *testing.T, r *rendered, want bool) {
	t.Helper()
	objects := []string{"ClusterRole/kubelock-lock-server-discovery", "ClusterRoleBinding/kubelock-lock-server-discovery",
		"Role/kubelock-lock-server-discovery", "RoleBinding/kubelock-lock-server-discovery"}
	if !want {
		for _, o := range objects {
			r.mustNot(t, o)
		}
		return
	}
	for kind, rule := range map[string]string{
		objects[0]: "apiregistration.k8s.io/apiservices/v1alpha1.locks.kubelock.io: get",
		objects[2]: "/services/kubelock-apiserver: get",
	} {
		role := &rbacv1.ClusterRole{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(r.must(t, kind).Object, role); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, pr := range role.Rules {
			got = append(got, fmt.Sprintf("%s/%s/%s: %s", strings.Join(pr.APIGroups, ","), strings.Join(pr.Resources, ","),
				strings.Join(pr.ResourceNames, ","), strings.Join(pr.Verbs, ",")))
		}
		if len(got) != 1 || got[0] != rule {
			t.Errorf("%s grants %v, want only %q", kind, got, rule)
		}
	}
	for _, kind := range []string{objects[1], objects[3]} {
		binding := &rbacv1.ClusterRoleBinding{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(r.must(t, kind).Object, binding); err != nil {
			t.Fatal(err)
		}
		if subjects := binding.Subjects; len(subjects) != 1 || subjects[0].Kind != rbacv1.GroupKind || subjects[0].Name != "system:authenticated" {
			t.Errorf("%s binds %v, want the group system:authenticated", kind, binding.Subjects)
		}
	}
}
