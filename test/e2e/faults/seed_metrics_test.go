//go:build faults

package faults

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/gomega"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Where an operation's time goes, from kube-apiserver's own histograms,
// read at each phase's edges: the server's time for a lock write, and of it
// the admission webhook's, etcd's and priority-and-fairness's queueing. What
// the client saw beyond the server's time was spent in the client, on the
// way, or waiting for a CPU.

// seedServerMetric is one histogram of the breakdown.
type seedServerMetric struct {
	Title string
	Name  string
	Match map[string]string
}

var seedServerMetrics = []seedServerMetric{
	{"apiserver: lock write (PUT status)", "apiserver_request_duration_seconds", map[string]string{"verb": "PUT", "resource": "distributedlocks", "subresource": "status"}},
	{"admission webhook (UPDATE)", "apiserver_admission_webhook_admission_duration_seconds", map[string]string{"type": "validating", "operation": "UPDATE"}},
	{"etcd: update of a lock", "etcd_request_duration_seconds", map[string]string{"operation": "update", "group": "locks.kubelock.io", "resource": "distributedlocks"}},
	{"priority and fairness: queue wait", "apiserver_flowcontrol_request_wait_duration_seconds", map[string]string{"flow_schema": "global-default", "execute": "true"}},
}

// serverScrape is kube-apiserver's /metrics at one moment, with the
// machine's load average then.
type serverScrape struct {
	body string
	load string
}

func scrapeServer(ctx context.Context, cfg *rest.Config) serverScrape {
	cs, err := kubernetes.NewForConfig(cfg)
	Expect(err).NotTo(HaveOccurred())
	var body []byte
	Eventually(func() (err error) {
		body, err = cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
		return err
	}).WithTimeout(time.Minute).Should(Succeed())
	return serverScrape{body: string(body), load: loadAverage()}
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

// histogram is a histogram's cumulative counts by upper bound, summed over
// the series that match.
type histogram map[float64]float64

func (s serverScrape) histogram(m seedServerMetric) histogram {
	h := histogram{}
	prefix := m.Name + "_bucket{"
	sc := bufio.NewScanner(strings.NewReader(s.body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		labels, value, ok := strings.Cut(line[len(prefix):], "} ")
		if !ok {
			continue
		}
		ls := parseLabels(labels)
		if !matches(ls, m.Match) {
			continue
		}
		le, err1 := strconv.ParseFloat(ls["le"], 64)
		v, err2 := strconv.ParseFloat(strings.Fields(value)[0], 64)
		if err1 == nil && err2 == nil {
			h[le] += v
		}
	}
	return h
}

// parseLabels reads a="x",b="y" (the values of these metrics hold no quotes or commas).
func parseLabels(s string) map[string]string {
	ls := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			ls[k] = strings.Trim(v, `"`)
		}
	}
	return ls
}

func matches(ls, want map[string]string) bool {
	for k, v := range want {
		if ls[k] != v {
			return false
		}
	}
	return true
}

func (h histogram) minus(o histogram) histogram {
	d := histogram{}
	for le, v := range h {
		d[le] = v - o[le]
	}
	return d
}

// quantile interpolates within the bucket the q-th observation falls in,
// as PromQL's histogram_quantile does; false without observations.
func (h histogram) quantile(q float64) (time.Duration, bool) {
	bounds := slices.Sorted(func(yield func(float64) bool) {
		for le := range h {
			if !yield(le) {
				return
			}
		}
	})
	if len(bounds) == 0 || h[math.Inf(1)] <= 0 {
		return 0, false
	}
	rank := q * h[math.Inf(1)]
	lower, below := 0.0, 0.0
	for _, le := range bounds {
		if h[le] >= rank {
			if math.IsInf(le, 1) {
				return seconds(lower), true // beyond the last bound: at least it
			}
			return seconds(lower + (le-lower)*(rank-below)/(h[le]-below)), true
		}
		lower, below = le, h[le]
	}
	return seconds(lower), true
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// seedBreakdown is the table of where the time went, per phase, from the
// scrapes at the phases' edges (one more than phases).
func seedBreakdown(stats []phaseStats, scrapes []serverScrape) string {
	var b strings.Builder
	b.WriteString("| phase | load average at start | client: acquire p50 / p99 |")
	for _, m := range seedServerMetrics {
		fmt.Fprintf(&b, " %s p50 / p99 |", m.Title)
	}
	b.WriteString("\n|---|---|---|" + strings.Repeat("---|", len(seedServerMetrics)) + "\n")
	for i, s := range stats {
		a := s.Ops["acquire"]
		fmt.Fprintf(&b, "| %s | %s | %s / %s |", s.Name, scrapes[i].load, fmtP(a.P50), fmtP(a.P99))
		for _, m := range seedServerMetrics {
			h := scrapes[i+1].histogram(m).minus(scrapes[i].histogram(m))
			p50, ok := h.quantile(0.50)
			p99, _ := h.quantile(0.99)
			if !ok {
				b.WriteString(" — |")
				continue
			}
			fmt.Fprintf(&b, " %s / %s (%.0f) |", fmtP(p50), fmtP(p99), h[math.Inf(1)])
		}
		b.WriteString("\n")
	}
	return b.String()
}
