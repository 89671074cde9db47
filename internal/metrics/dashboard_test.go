package metrics_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/yaml"

	"github.com/kubelock/kubelock/internal/metrics"
	"github.com/kubelock/kubelock/pkg/fencing"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/testenv"
)

// external are the metrics of other components the dashboard may use.
var external = map[string]bool{
	"apiserver_request_duration_seconds_bucket": true,
}

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// exported collects the series names kubelock's code exports: every
// collector of the operator, the client library and pkg/fencing, with the
// _bucket, _count and _sum series of histograms.
func exported(t *testing.T) (names map[string]bool, bases []string) {
	t.Helper()
	var lm registered
	if _, err := lock.NewFromClient(fake.NewClientBuilder().Build(), lock.WithMetrics(&lm)); err != nil {
		t.Fatal(err)
	}
	fm, err := fencing.NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	names = map[string]bool{}
	collectors := slices.Concat(metrics.Collectors(), lm, fm.Collectors())
	for _, c := range collectors {
		_, isHistogram := c.(prometheus.Histogram)
		if _, ok := c.(*prometheus.HistogramVec); ok {
			isHistogram = true
		}
		ch := make(chan *prometheus.Desc, 16)
		c.Describe(ch)
		close(ch)
		for d := range ch {
			m := fqName.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("no name in %s", d)
			}
			bases = append(bases, m[1])
			names[m[1]] = true
			if isHistogram {
				for _, s := range []string{"_bucket", "_count", "_sum"} {
					names[m[1]+s] = true
				}
			}
		}
	}
	sort.Strings(bases)
	return names, bases
}

// registered is a prometheus.Registerer that keeps what is registered with it.
type registered []prometheus.Collector

func (r *registered) Register(c prometheus.Collector) error   { *r = append(*r, c); return nil }
func (r *registered) MustRegister(cs ...prometheus.Collector) { *r = append(*r, cs...) }
func (r *registered) Unregister(prometheus.Collector) bool    { return false }

// metricRef finds metric names in PromQL: kubelock's own and other components'.
var metricRef = regexp.MustCompile(`\b(?:kubelock|apiserver|etcd|controller_runtime|workqueue)_[a-z0-9_]+\b`)

func checkExpr(t *testing.T, where, expr string, names map[string]bool) {
	t.Helper()
	refs := metricRef.FindAllString(expr, -1)
	if len(refs) == 0 {
		t.Errorf("%s: query %q names no metric", where, expr)
	}
	for _, r := range refs {
		if !names[r] && !external[r] {
			t.Errorf("%s: query names %s, which kubelock does not export", where, r)
		}
	}
}

type panel struct {
	Title   string `json:"title"`
	Type    string `json:"type"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

// TestDashboardNamesExportedMetrics parses the Grafana dashboard and checks
// that every panel has a query and every query names metrics the code exports.
func TestDashboardNamesExportedMetrics(t *testing.T) {
	names, _ := exported(t)
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "grafana", "kubelock-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Title  string  `json:"title"`
		UID    string  `json:"uid"`
		Panels []panel `json:"panels"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("the dashboard is not valid JSON: %v", err)
	}
	if d.Title == "" || d.UID == "" {
		t.Fatalf("the dashboard needs a title and a uid, got %q, %q", d.Title, d.UID)
	}
	used := map[string]bool{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, q := range p.Targets {
				checkExpr(t, "panel "+p.Title, q.Expr, names)
				for _, r := range metricRef.FindAllString(q.Expr, -1) {
					used[r] = true
				}
			}
		}
	}
	walk(d.Panels)
	// The seed's panels are there.
	for _, m := range []string{
		"kubelock_client_operation_duration_seconds_bucket", "kubelock_client_operation_duration_seconds_count",
		"kubelock_controller_locks_held", "kubelock_controller_waiters", "kubelock_controller_expirations_total",
		"kubelock_client_locks_lost_total", "kubelock_controller_leader_changes_total", "kubelock_controller_is_leader",
		"kubelock_webhook_stale_token_rejections_total", "kubelock_fencing_stale_token_rejections_total",
		"kubelock_controller_hot_lock_waiters", "kubelock_controller_hot_lock_acquisitions_total",
		"kubelock_controller_handoff_seconds_bucket",
	} {
		if !used[m] {
			t.Errorf("no panel shows %s", m)
		}
	}
}

// TestAlertsNameExportedMetrics checks the PrometheusRule the same way.
func TestAlertsNameExportedMetrics(t *testing.T) {
	names, _ := exported(t)
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "prometheus", "prometheus_rule.yaml"))
	if err != nil {
		t.Fatal(err)
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
	if err := yaml.Unmarshal(raw, &rule); err != nil {
		t.Fatal(err)
	}
	alerts := 0
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			alerts++
			checkExpr(t, "alert "+r.Alert, r.Expr, names)
		}
	}
	if alerts == 0 {
		t.Fatal("no alerts found")
	}
}

// TestDocsListEveryMetric checks that docs/observability.md names every
// exported metric and every alert.
func TestDocsListEveryMetric(t *testing.T) {
	_, bases := exported(t)
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "docs", "observability.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	for _, b := range bases {
		if !strings.Contains(doc, "`"+b+"`") {
			t.Errorf("docs/observability.md does not list `%s`", b)
		}
	}
	rules, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "prometheus", "prometheus_rule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`alert: (\w+)`).FindAllStringSubmatch(string(rules), -1) {
		if !strings.Contains(doc, m[1]) {
			t.Errorf("docs/observability.md does not explain alert %s", m[1])
		}
	}
}
