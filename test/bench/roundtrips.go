package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/rest"
)

// Round-trip accounting: the workloads tag each operation's context with its
// phase (acquire, release); a wrapper around the clients' transport counts the
// apiserver requests each phase sent and how long each took, so a latency
// figure comes with how many round trips, and of which kind, it paid for.

type phaseKey struct{}

// inPhase tags ctx: requests sent with it count for phase.
func inPhase(ctx context.Context, phase string) context.Context {
	return context.WithValue(ctx, phaseKey{}, phase)
}

// trips is the requests and operations of each phase.
type trips struct {
	mu  sync.Mutex
	lat map[string]map[string][]time.Duration // phase -> "VERB resource[/sub]" -> latencies
	ops map[string]int                        // phase -> operations that completed
}

func newTrips() *trips {
	return &trips{lat: map[string]map[string][]time.Duration{}, ops: map[string]int{}}
}

// wrap is cfg with a transport that counts tagged requests into t.
func (t *trips) wrap(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &tripper{rt: rt, t: t} })
	return cfg
}

// reset forgets what was counted so far.
func (t *trips) reset() {
	t.mu.Lock()
	t.lat, t.ops = map[string]map[string][]time.Duration{}, map[string]int{}
	t.mu.Unlock()
}

// done counts one completed operation of phase.
func (t *trips) done(phase string) {
	if t == nil {
		return
	}
	t.mu.Lock()
	t.ops[phase]++
	t.mu.Unlock()
}

type tripper struct {
	rt http.RoundTripper
	t  *trips
}

// RoundTrip times until the response headers: for the small bodies of lock
// objects that is the request's round trip.
func (r *tripper) RoundTrip(req *http.Request) (*http.Response, error) {
	phase, _ := req.Context().Value(phaseKey{}).(string)
	if phase == "" {
		return r.rt.RoundTrip(req)
	}
	start := time.Now()
	resp, err := r.rt.RoundTrip(req)
	d := time.Since(start)
	kind := requestKind(req)
	if err == nil && resp.StatusCode >= 300 {
		kind += fmt.Sprintf(" (%d)", resp.StatusCode)
	} else if err != nil {
		kind += " (error)"
	}
	r.t.mu.Lock()
	if r.t.lat[phase] == nil {
		r.t.lat[phase] = map[string][]time.Duration{}
	}
	r.t.lat[phase][kind] = append(r.t.lat[phase][kind], d)
	r.t.mu.Unlock()
	return resp, err
}

// requestKind is "VERB resource[/subresource]" of an apiserver request.
func requestKind(req *http.Request) string {
	verb := req.Method
	if verb == http.MethodGet && req.URL.Query().Get("watch") == "true" {
		verb = "WATCH"
	}
	seg := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	switch {
	case len(seg) >= 2 && seg[0] == "api":
		seg = seg[2:] // api/v1
	case len(seg) >= 3 && seg[0] == "apis":
		seg = seg[3:] // apis/group/version
	default:
		return verb + " " + req.URL.Path
	}
	if len(seg) >= 3 && seg[0] == "namespaces" {
		seg = seg[2:]
	}
	if len(seg) == 0 {
		return verb
	}
	res := seg[0]
	if len(seg) >= 3 {
		res += "/" + seg[2]
	}
	if verb == http.MethodGet && len(seg) == 1 {
		verb = "LIST"
	}
	return verb + " " + res
}

// tripLine is one kind of request of one phase.
type tripLine struct {
	Phase, Kind string
	PerOp       float64
	Lat         dist
}

// summary is, per phase and kind of request, the requests per completed
// operation and their latency.
func (t *trips) summary() []tripLine {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []tripLine
	for phase, kinds := range t.lat {
		for kind, lat := range kinds {
			per := 0.0
			if n := t.ops[phase]; n > 0 {
				per = float64(len(lat)) / float64(n)
			}
			out = append(out, tripLine{Phase: phase, Kind: kind, PerOp: per, Lat: summarize(lat)})
		}
	}
	slices.SortFunc(out, func(a, b tripLine) int {
		if c := strings.Compare(a.Phase, b.Phase); c != 0 {
			return c
		}
		return strings.Compare(a.Kind, b.Kind)
	})
	return out
}

func tripsString(lines []tripLine) string {
	var parts []string
	for _, l := range lines {
		s := fmt.Sprintf("%s: %.2f× %s", l.Phase, l.PerOp, l.Kind)
		if !strings.HasPrefix(l.Kind, "WATCH") {
			s += fmt.Sprintf(" (p50 %s p99 %s ms)", ms(l.Lat.P50), ms(l.Lat.P99))
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}

// --- the apiserver's view ------------------------------------------------------

// serverTime is apiserver_request_duration_seconds (sum and count) by "VERB
// resource[/subresource]", and the admission time inside it.
type serverTime map[string][2]float64

func (c *cluster) serverTimes(ctx context.Context) (serverTime, error) {
	body, err := c.adminCS.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	st := serverTime{}
	add := func(key string, i int) func(map[string]string, float64) {
		return func(l map[string]string, v float64) {
			k := key
			if k == "" {
				k = l["verb"] + " " + l["resource"]
				if l["subresource"] != "" {
					k += "/" + l["subresource"]
				}
			}
			x := st[k]
			x[i] += v
			st[k] = x
		}
	}
	sumMetric(body, "apiserver_request_duration_seconds_sum", add("", 0))
	sumMetric(body, "apiserver_request_duration_seconds_count", add("", 1))
	sumMetric(body, "apiserver_admission_webhook_admission_duration_seconds_sum", add("admission webhook", 0))
	sumMetric(body, "apiserver_admission_webhook_admission_duration_seconds_count", add("admission webhook", 1))
	sumMetric(body, "apiserver_admission_step_admission_duration_seconds_sum", add("admission steps", 0))
	sumMetric(body, "apiserver_admission_step_admission_duration_seconds_count", add("admission steps", 1))
	// The webhook server's own time per review, inside the apiserver's "admission webhook".
	if mgr, err := httpGet(ctx, c.mgrMetrics); err == nil {
		sumMetric(mgr, "controller_runtime_webhook_latency_seconds_sum", add("admission webhook, in the operator", 0))
		sumMetric(mgr, "controller_runtime_webhook_latency_seconds_count", add("admission webhook, in the operator", 1))
	}
	return st, nil
}

// meanSince is the mean server time (ms) of each key with requests since before.
func (st serverTime) meanSince(before serverTime) string {
	var keys []string
	for k, v := range st {
		if v[1]-before[k][1] >= 1 && (strings.Contains(k, "distributedlocks") || strings.Contains(k, "leases") || strings.HasPrefix(k, "admission")) && !strings.HasPrefix(k, "WATCH") {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		n := st[k][1] - before[k][1]
		parts = append(parts, fmt.Sprintf("%s: %.0f× mean %.2f ms", k, n, 1000*(st[k][0]-before[k][0])/n))
	}
	return strings.Join(parts, "; ")
}

// tripsPerOp is how many requests of each kind one operation of phase sent,
// e.g. "1.00 GET distributedlocks + 1.00 PUT distributedlocks/status".
func tripsPerOp(lines []tripLine, phase string) string {
	var parts []string
	for _, l := range lines {
		if l.Phase == phase && l.PerOp >= 0.005 {
			parts = append(parts, fmt.Sprintf("%.2f %s", l.PerOp, l.Kind))
		}
	}
	if len(parts) == 0 {
		return "–"
	}
	return strings.Join(parts, " + ")
}
