package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/kubelock/kubelock/pkg/lock"
)

// Handler serves the agent's own API, Dapr's lock API and the probes:
//
//	POST   /v1/locks/{key}?wait=&lease=&shared=  acquire (try when wait is 0 or absent)
//	GET    /v1/locks/{key}?leaseID=&wait=        get; with wait, a long poll that answers once the holding ends
//	POST   /v1/locks/{key}/renew?leaseID=        renew the holding's lease
//	DELETE /v1/locks/{key}?leaseID=              release
//	GET    /v1/locks                             every holding of the agent
//	GET    /healthz                              200 while the process runs
//	GET    /readyz                               200 while the agent has a session
//
// A key is one path segment: escape "/" in it as %2F. Parameters go in the
// query string; durations are Go's ("10s", "1m30s") or whole seconds ("10").
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/locks/{key}", a.acquire)
	mux.HandleFunc("GET /v1/locks/{key}", a.get)
	mux.HandleFunc("DELETE /v1/locks/{key}", a.releaseHolding)
	mux.HandleFunc("POST /v1/locks/{key}/renew", a.renew)
	mux.HandleFunc("GET /v1/locks", a.list)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", a.readyz)
	for _, path := range []string{"/v1/locks/{key}", "/v1/locks/{key}/renew", "/v1/locks"} {
		mux.HandleFunc(path, methodNotAllowed)
	}
	a.daprRoutes(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, reasonNoEndpoint, fmt.Sprintf(
			"kubelock agent: no endpoint %s %s: locks are at /v1/locks/{key} (escape / in a key as %%2F), Dapr's lock API at /v1.0-alpha1/lock/{store}",
			r.Method, shown(r.URL.EscapedPath())))
	})
	return mux
}

// Server is an HTTP server of Handler with bounds for a peer that may be
// hostile: headers and bodies read within 10s, headers of at most 64 KiB
// (the agent's own API takes no body; Dapr's, at most maxDaprBody). A long
// poll is not bounded by them: it waits after the request is read.
func (a *Agent) Server() *http.Server {
	return &http.Server{
		Handler:           localOnly(a.Handler()),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
}

// localOnly refuses what only a browser sends: an Origin (a web page's
// script posting to 127.0.0.1, which needs no preflight for a bodiless POST
// or a text/plain one) and a Host that is not loopback (DNS rebinding: a
// page's own name made to resolve to 127.0.0.1). Apps, SDKs and curl send
// neither.
func localOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, err := net.SplitHostPort(r.Host)
		if err != nil {
			host = r.Host
		}
		ip := net.ParseIP(host)
		switch {
		case r.Header.Get("Origin") != "":
			writeError(w, http.StatusForbidden, reasonNotLocal, "kubelock agent: a request with an Origin comes from a web page: the agent serves the pod's programs only")
		case host != "" && host != "localhost" && (ip == nil || !ip.IsLoopback()): // HTTP/1.0 may send none; a browser always does
			writeError(w, http.StatusForbidden, reasonNotLocal, fmt.Sprintf("kubelock agent: Host %s is not a loopback address: call the agent as 127.0.0.1, [::1] or localhost", shown(r.Host)))
		default:
			next.ServeHTTP(w, r)
		}
	})
}

// Reasons of the API's errors (the "reason" of the JSON), beside the end
// reasons of a holding that is over (released, expired, lost).
const (
	reasonBadRequest  = "bad-request"
	reasonLocked      = "locked"      // TryAcquire: held, or others queue first
	reasonTimeout     = "timeout"     // waited up to wait; still not ours
	reasonQueueFull   = "queue-full"  // the lock's wait queue is at spec.maxWaiters
	reasonMode        = "mode"        // shared on a Mutex
	reasonNoLock      = "no-lock"     // the lock object does not exist (the agent runs --create=false)
	reasonNotHeld     = "not-held"    // no holding of the key with that lease ID
	reasonDenied      = "denied"      // RBAC or admission refused the write
	reasonUnavailable = "unavailable" // the apiserver is unreachable, or the agent is stopping
	reasonTooMany     = "too-many"    // Options.MaxLocks reached
	reasonNoEndpoint  = "no-endpoint"
	reasonNotLocal    = "not-local" // a browser's request (Origin, or a Host not loopback)
)

// holdingView is a holding as the API shows it.
type holdingView struct {
	Key string `json:"key"`
	// Lock is the DistributedLock: namespace/name.
	Lock         string `json:"lock"`
	LeaseID      string `json:"leaseID"`
	FencingToken int64  `json:"fencingToken"`
	// Slot is a shared holding's permit (an RWMutex's reader, a Semaphore's).
	Slot *int32 `json:"slot,omitempty"`
	Held bool   `json:"held"`
	// LeaseSeconds is how long the holding lasts without a renewal.
	LeaseSeconds int64 `json:"leaseSeconds"`
	// ExpiresAt is the safe deadline: act on the holding only before it. It
	// is the end of the lease, or sooner the session's safe deadline; a
	// renewal (and the agent's own renewals of the session) move it.
	ExpiresAt time.Time `json:"expiresAt"`
	Session   string    `json:"session"`
	// Ended is why a holding is over: released, expired or lost.
	Ended string `json:"ended,omitempty"`
}

func (a *Agent) view(h *holding) holdingView {
	v := holdingView{
		Key: h.key, Lock: a.c.Namespace() + "/" + h.l.Name(), LeaseID: h.l.LeaseID(), FencingToken: h.l.FencingToken(),
		LeaseSeconds: int64(h.lease / time.Second), ExpiresAt: h.deadline(), Session: h.session,
	}
	if slot, shared := h.l.Slot(); shared {
		v.Slot = &slot
	}
	v.Held, v.Ended, _ = h.state()
	return v
}

func (a *Agent) acquire(w http.ResponseWriter, r *http.Request) {
	p, err := parseQuery(r, "wait", "lease", "shared")
	if err == nil {
		err = checkKey(r.PathValue("key"))
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, reasonBadRequest, err.Error())
		return
	}
	lease := a.o.Lease
	if p.lease > 0 {
		lease = p.lease
	}
	h, err := a.take(r.Context(), r.PathValue("key"), p.wait, p.shared, lease, "")
	if err != nil {
		code, reason := acquireError(err)
		writeError(w, code, reason, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, a.view(h))
}

// acquireError is the status and reason of an acquire's error.
func acquireError(err error) (int, string) {
	var tooMany errTooMany
	switch {
	case errors.Is(err, lock.ErrLocked):
		return http.StatusConflict, reasonLocked
	case errors.Is(err, lock.ErrTimeout):
		return http.StatusConflict, reasonTimeout
	case errors.Is(err, lock.ErrQueueFull):
		return http.StatusConflict, reasonQueueFull
	case errors.Is(err, lock.ErrMode):
		return http.StatusBadRequest, reasonMode
	case errors.Is(err, lock.ErrNotFound):
		return http.StatusNotFound, reasonNoLock
	case errors.As(err, &tooMany):
		return http.StatusTooManyRequests, reasonTooMany
	case apierrors.IsForbidden(err), apierrors.IsUnauthorized(err), apierrors.IsInvalid(err):
		return http.StatusForbidden, reasonDenied
	}
	return http.StatusServiceUnavailable, reasonUnavailable
}

func (a *Agent) get(w http.ResponseWriter, r *http.Request) {
	h, p, ok := a.holdingOf(w, r, "leaseID", "wait")
	if !ok {
		return
	}
	if p.wait > 0 {
		t := time.NewTimer(p.wait)
		defer t.Stop()
		select {
		case <-h.l.Done():
		case <-t.C:
		case <-r.Context().Done():
			return
		}
	}
	a.answer(w, h)
}

// answer writes h's view while it is live, else a 404 saying why it ended.
func (a *Agent) answer(w http.ResponseWriter, h *holding) {
	live, reason, cause := h.state()
	if live {
		writeJSON(w, http.StatusOK, a.view(h))
		return
	}
	msg := fmt.Sprintf("kubelock agent: lease %s of %s is over: %s", h.l.LeaseID(), shown(h.key), reason)
	switch {
	case cause != nil:
		msg += ": " + cause.Error()
	case reason == endExpired:
		msg += fmt.Sprintf(": not renewed within its lease of %s", h.lease)
	}
	writeError(w, http.StatusNotFound, reason, msg)
}

func (a *Agent) renew(w http.ResponseWriter, r *http.Request) {
	h, _, ok := a.holdingOf(w, r, "leaseID")
	if !ok {
		return
	}
	h.renew()
	a.answer(w, h)
}

func (a *Agent) releaseHolding(w http.ResponseWriter, r *http.Request) {
	h, _, ok := a.holdingOf(w, r, "leaseID")
	if !ok {
		return
	}
	claimed, err := a.end(h, endReleased)
	switch {
	case !claimed || errors.Is(err, lock.ErrLockLost):
		a.answer(w, h)
	case err != nil:
		writeError(w, http.StatusServiceUnavailable, reasonUnavailable, fmt.Sprintf(
			"kubelock agent: the release of %s is not confirmed (the holding ends with the agent's session at the latest): %v", shown(h.key), err))
	default:
		writeJSON(w, http.StatusOK, a.view(h))
	}
}

// holdingOf parses the query (leaseID required, and allowed) and finds the
// holding; it writes the error and returns false when there is none.
func (a *Agent) holdingOf(w http.ResponseWriter, r *http.Request, allowed ...string) (*holding, params, bool) {
	p, err := parseQuery(r, allowed...)
	if err == nil && p.leaseID == "" {
		err = errors.New("kubelock agent: leaseID is required: the leaseID an acquire answered")
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, reasonBadRequest, err.Error())
		return nil, p, false
	}
	key := r.PathValue("key")
	h := a.lookup(key, p.leaseID)
	if h == nil {
		writeError(w, http.StatusNotFound, reasonNotHeld, fmt.Sprintf("kubelock agent: this agent holds no lease %s of %s", shown(p.leaseID), shown(key)))
		return nil, p, false
	}
	return h, p, true
}

func (a *Agent) list(w http.ResponseWriter, r *http.Request) {
	if _, err := parseQuery(r); err != nil {
		writeError(w, http.StatusBadRequest, reasonBadRequest, err.Error())
		return
	}
	views := []holdingView{}
	for _, h := range a.holdings(nil) {
		views = append(views, a.view(h))
	}
	writeJSON(w, http.StatusOK, map[string]any{"holdings": views})
}

func (a *Agent) readyz(w http.ResponseWriter, _ *http.Request) {
	if !a.Ready() {
		http.Error(w, "no session", http.StatusServiceUnavailable)
		return
	}
	_, _ = io.WriteString(w, "ok\n")
}

func methodNotAllowed(w http.ResponseWriter, r *http.Request) {
	writeError(w, http.StatusMethodNotAllowed, reasonBadRequest, fmt.Sprintf("kubelock agent: %s is not a method of %s", shown(r.Method), shown(r.URL.EscapedPath())))
}

// apiError is the JSON of every error of the agent's own API.
type apiError struct {
	Error  string `json:"error"`
	Reason string `json:"reason"`
}

func writeError(w http.ResponseWriter, code int, reason, msg string) {
	writeJSON(w, code, apiError{Error: msg, Reason: reason})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
