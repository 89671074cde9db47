package lockapi_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/kubelock/kubelock/test/testenv"
)

// selector is one metric selector of a PromQL expression: the metric's name
// and its label matchers.
var selector = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}`)

// jobLabel is a selector's job="…" matcher.
var jobLabel = regexp.MustCompile(`job="([^"]+)"`)

// TestBackendAlertsNameServedMetrics renders the chart's alerts for the
// apiserver backend and checks every metric they select against what the
// processes built here serve: a selector with job="kubelock-apiserver"
// against kubelock-apiserver's /metrics, job="kubelock-etcd-client" (the
// ServiceMonitor's job for the lock store) against its etcd's, and one
// without a job against kube-apiserver's (the APIService's availability).
// An alert on a series nobody exports never fires.
func TestBackendAlertsNameServedMetrics(t *testing.T) {
	ctx := t.Context()
	helm, err := testenv.Helm()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, helm, "template", "kubelock", filepath.Join(testenv.RepoRoot(), "dist", "chart"),
		"--set", "backend=apiserver", "--set", "prometheus.rule.enable=true",
		"--show-only", "templates/apiserver/prometheusrule.yaml").Output()
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	var rule struct {
		Spec struct {
			Groups []struct {
				Rules []struct {
					Alert string `json:"alert"`
					Expr  string `json:"expr"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(out, &rule); err != nil {
		t.Fatal(err)
	}

	kube, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	lockAPI, err := kubernetes.NewForConfig(server.Direct(env.Config))
	if err != nil {
		t.Fatal(err)
	}
	served := map[string]map[string]bool{
		"":                     families(t, func() ([]byte, error) { return kube.RESTClient().Get().AbsPath("/metrics").DoRaw(ctx) }),
		"kubelock-apiserver":   families(t, func() ([]byte, error) { return lockAPI.RESTClient().Get().AbsPath("/metrics").DoRaw(ctx) }),
		"kubelock-etcd-client": families(t, func() ([]byte, error) { return httpGet(ctx, server.Etcd.Endpoints()[0]+"/metrics") }),
	}
	alerts := 0
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			alerts++
			sels := selector.FindAllStringSubmatch(r.Expr, -1)
			if len(sels) == 0 {
				t.Errorf("alert %s: %q selects no metric", r.Alert, r.Expr)
			}
			for _, s := range sels {
				name, job := s[1], ""
				if m := jobLabel.FindStringSubmatch(s[2]); m != nil {
					job = m[1]
				}
				if name == "up" {
					continue // Prometheus' own, for each target it scrapes
				}
				exported, ok := served[job]
				if !ok {
					t.Errorf("alert %s: %s{%s} selects job %q, which no ServiceMonitor of the chart scrapes", r.Alert, name, s[2], job)
					continue
				}
				if !exported[name] {
					t.Errorf("alert %s: %s is not served by job %q", r.Alert, name, job)
				}
				// kube-apiserver serves the generic server's metrics too: a
				// selector that lost its job would count both.
				if job == "" && (served["kubelock-apiserver"][name] || served["kubelock-etcd-client"][name]) {
					t.Errorf("alert %s: %s{%s} has no job, and the backend's processes serve it too", r.Alert, name, s[2])
				}
			}
		}
	}
	if alerts == 0 {
		t.Fatal("the chart renders no alert for the apiserver backend")
	}
	t.Logf("%d alerts, each selecting series the backend's processes serve", alerts)
}

// families are the series names a /metrics page serves: each family's name,
// with a histogram's and a summary's _bucket, _sum and _count.
func families(t *testing.T, get func() ([]byte, error)) map[string]bool {
	t.Helper()
	body, err := get()
	if err != nil {
		t.Fatal(err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	parsed, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for name, f := range parsed {
		names[name] = true
		if f.GetType() == dto.MetricType_HISTOGRAM || f.GetType() == dto.MetricType_SUMMARY {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				names[name+suffix] = true
			}
		}
	}
	return names
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
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return io.ReadAll(resp.Body)
}
