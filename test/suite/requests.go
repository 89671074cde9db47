package suite

import (
	"net/http"
	"strings"
	"sync"

	"k8s.io/client-go/rest"
)

// Requests counts what a client sends: its lock status writes, the 403s
// its requests got, and its /readyz polls (a lock client asks /readyz when
// a starting apiserver may have refused it).
type Requests struct {
	mu   sync.Mutex
	sent Sent
}

// Sent is what Requests counted.
type Sent struct{ Writes, Refused, Polls int }

// Count returns a copy of cfg whose clients count their requests in r.
func (r *Requests) Count(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(req)
			r.mu.Lock()
			defer r.mu.Unlock()
			if req.URL.Path == "/readyz" {
				r.sent.Polls++
				return resp, err
			}
			if req.Method == http.MethodPut && strings.HasSuffix(req.URL.Path, "/status") {
				r.sent.Writes++
			}
			if err == nil && resp.StatusCode == http.StatusForbidden {
				r.sent.Refused++
			}
			return resp, err
		})
	})
	return cfg
}

// Since is what was counted since before, an earlier Get.
func (r *Requests) Since(before Sent) Sent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return Sent{r.sent.Writes - before.Writes, r.sent.Refused - before.Refused, r.sent.Polls - before.Polls}
}

// Get is what was counted so far.
func (r *Requests) Get() Sent { return r.Since(Sent{}) }

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
