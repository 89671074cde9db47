// Package faultproxy is an HTTP proxy in front of the kube-apiserver that tests
// use to lose responses after the apiserver committed a write, refuse requests,
// answer 503 or delay them. It speaks plain HTTP to the client and forwards
// with the upstream config's credentials, so the apiserver still sees the real
// user.
package faultproxy

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
)

// Action is what the proxy does with one request.
type Action int

const (
	// Pass forwards the request and its response.
	Pass Action = iota
	// DropResponse forwards the request, waits for the apiserver's answer, then
	// cuts the client's connection: the write committed, the client cannot know.
	DropResponse
	// Refuse cuts the client's connection without forwarding anything.
	Refuse
	// Hold keeps the request until the apiserver accepts connections, then
	// forwards it (at once when it does), as a load balancer queues requests
	// while its only backend restarts and sends them the moment it listens.
	Hold
	// Unavailable answers 503 without forwarding anything, as kube-apiserver
	// answers for an aggregated API whose Service endpoint has just gone.
	Unavailable
)

// Rule decides the action for a request; nil means Pass for everything.
type Rule func(*http.Request) Action

// Proxy is a running fault proxy.
type Proxy struct {
	srv       *httptest.Server
	transport http.RoundTripper
	target    *url.URL
	rp        *httputil.ReverseProxy

	mu      sync.Mutex
	rule    Rule
	delay   time.Duration
	answers map[string]map[int]int64 // statuses passed on, by User-Agent; 502 for no answer
	waited  map[string]int64         // held requests that found the apiserver down, by User-Agent
	dropped atomic.Int64
}

// New starts a proxy to the apiserver of upstream.
func New(upstream *rest.Config) (*Proxy, error) {
	rt, err := rest.TransportFor(upstream)
	if err != nil {
		return nil, err
	}
	target, err := url.Parse(upstream.Host)
	if err != nil {
		return nil, err
	}
	p := &Proxy{transport: rt, target: target, answers: map[string]map[int]int64{}, waited: map[string]int64{}}
	p.rp = &httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(target) },
		Transport:     rt,
		FlushInterval: -1, // stream watch events as they come
		ModifyResponse: func(resp *http.Response) error {
			p.answered(resp.Request.UserAgent(), resp.StatusCode)
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() == nil { // not the client's own cancellation
				p.answered(r.UserAgent(), http.StatusBadGateway)
			}
			w.WriteHeader(http.StatusBadGateway)
		},
	}
	p.srv = httptest.NewServer(http.HandlerFunc(p.serve))
	return p, nil
}

// Config is a client connection through the proxy.
func (p *Proxy) Config() *rest.Config {
	return &rest.Config{Host: p.srv.URL, QPS: -1}
}

// SetRule replaces the rule; nil passes everything.
func (p *Proxy) SetRule(r Rule) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rule = r
}

// SetDelay delays every request by d before forwarding it.
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay = d
}

// Dropped counts responses dropped after the apiserver answered.
func (p *Proxy) Dropped() int64 { return p.dropped.Load() }

// Forbidden counts the 403 answers the proxy passed on to clients whose
// User-Agent starts with agent.
func (p *Proxy) Forbidden(agent string) int64 { return p.Answers(agent)[http.StatusForbidden] }

// Answers counts the answers the proxy passed on to clients whose User-Agent
// starts with agent, by status; a request the apiserver did not answer (its
// connection failed) counts as the proxy's own 502.
func (p *Proxy) Answers(agent string) map[int]int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := map[int]int64{}
	for ua, byStatus := range p.answers {
		if strings.HasPrefix(ua, agent) {
			for status, c := range byStatus {
				n[status] += c
			}
		}
	}
	return n
}

// Waited counts the requests of clients whose User-Agent starts with agent
// that Hold kept because the apiserver was not accepting connections, then
// forwarded once it was.
func (p *Proxy) Waited(agent string) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var n int64
	for ua, c := range p.waited {
		if strings.HasPrefix(ua, agent) {
			n += c
		}
	}
	return n
}

func (p *Proxy) answered(agent string, status int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.answers[agent] == nil {
		p.answers[agent] = map[int]int64{}
	}
	p.answers[agent][status]++
}

// CutConnections cuts every open client connection (a watch in progress
// too), as a network break would; the proxy keeps serving new ones.
func (p *Proxy) CutConnections() { p.srv.CloseClientConnections() }

// Close stops the proxy and cuts every connection.
func (p *Proxy) Close() {
	p.srv.CloseClientConnections()
	p.srv.Close()
}

func (p *Proxy) serve(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	rule, delay := p.rule, p.delay
	p.mu.Unlock()
	if delay > 0 {
		time.Sleep(delay)
	}
	action := Pass
	if rule != nil {
		action = rule(r)
	}
	switch action {
	case Refuse:
		panic(http.ErrAbortHandler)
	case Hold:
		waited, ok := p.awaitUpstream(r.Context())
		if !ok {
			panic(http.ErrAbortHandler)
		}
		if waited {
			p.mu.Lock()
			p.waited[r.UserAgent()]++
			p.mu.Unlock()
		}
		p.rp.ServeHTTP(w, r)
	case Unavailable:
		p.answered(r.UserAgent(), http.StatusServiceUnavailable)
		st := apierrors.NewServiceUnavailable("the server is currently unable to handle the request").ErrStatus
		st.Kind, st.APIVersion = "Status", "v1"
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_ = json.NewEncoder(w).Encode(st)
	case DropResponse:
		out := r.Clone(r.Context())
		out.RequestURI = ""
		out.URL.Scheme, out.URL.Host = p.target.Scheme, p.target.Host
		out.Host = p.target.Host
		resp, err := p.transport.RoundTrip(out)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
		p.dropped.Add(1)
		panic(http.ErrAbortHandler) // the client's connection is cut mid-response
	default:
		p.rp.ServeHTTP(w, r)
	}
}

// awaitUpstream returns once the apiserver accepts a connection (ok), and
// whether it had to wait for that; not ok if ctx ends first.
func (p *Proxy) awaitUpstream(ctx context.Context) (waited, ok bool) {
	var d net.Dialer
	for tries := 0; ; tries++ {
		dctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		c, err := d.DialContext(dctx, "tcp", p.target.Host)
		cancel()
		if err == nil {
			_ = c.Close()
			return tries > 0, true
		}
		select {
		case <-ctx.Done():
			return tries > 0, false
		case <-time.After(2 * time.Millisecond):
		}
	}
}
