package lock

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"path"
	"regexp"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
)

// A kube-apiserver serves requests as soon as it listens, before its RBAC
// authorizer has synced its informers; until then it answers 403 to users its
// rules allow, and its /readyz fails. Its own admission plugins (webhooks,
// policies, namespace lifecycle) likewise refuse with 403 "not yet ready to
// handle request" until their configuration is loaded. Taken as final, such a
// 403 would fail a Release sent across an apiserver restart, and the lock
// would stay held until the controller expires it. So a client built by New
// sends again a request refused that way while /readyz does not pass,
// pausing between tries, within the request's context (a renewal's ends at
// the holding's safe deadline) and for at most notReadyPatience. Every other
// 403 is answered at once: a rule's (a [kubelock:...] tag from the webhook or
// the policy, or any other admission plugin's) and the authorizer's on a
// ready apiserver.
//
// Sending a write again cannot apply it twice: both refusals come before the
// request reaches storage (the authorizer is a filter in front of every
// handler, admission runs before the write), so the refused try changed
// nothing and only one try can commit. A try whose answer is lost is not
// sent again: its error goes to the caller, whose own retry knows whether
// the write is safe to repeat (a status write carries its resourceVersion).

// notReadyPatience bounds how long one request is sent again while the
// apiserver is not ready. It also bounds the wait for a real denial where
// /readyz never passes for the client (an administrator who took away
// system:public-info-viewer, or a store that stays down): as long as
// TryAcquire retries a lost response.
const notReadyPatience = tryTimeout

// startingRefusal matches the messages of the 403s a starting apiserver
// sends: the authorizer's (responsewriters.ForbiddenStatusError in
// k8s.io/apiserver: `<resource> "<name>" is forbidden: User "<user>" cannot
// <verb> resource ...`, or `forbidden: User "<user>" cannot <verb> path ...`,
// its reason after it, if any), and an admission plugin's before its
// configuration is loaded (`<resource> "<name>" is forbidden: not yet ready
// to handle request`). A rule's refusal reads otherwise ("admission webhook
// ... denied the request", "ValidatingAdmissionPolicy ... denied request").
var startingRefusal = regexp.MustCompile(`^(?:\S+ (?:"(?:[^"\\]|\\.)*" )?is )?forbidden: (?:User "(?:[^"\\]|\\.)*" cannot \S+ (?:resource|path) "|not yet ready to handle request$)`)

// retryWhileNotReady makes the clients of cfg send again a request a
// starting apiserver refused while its /readyz does not pass.
func retryWhileNotReady(cfg *rest.Config) error {
	base, _, err := rest.DefaultServerUrlFor(cfg)
	if err != nil {
		return err
	}
	readyz := *base // under the host's path, as every request goes
	readyz.Path = path.Join("/", base.Path, "readyz")
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return &notReadyRetry{next: rt, readyz: &readyz}
	})
	return nil
}

// notReadyRetry is the transport retryWhileNotReady puts in front of next.
type notReadyRetry struct {
	next   http.RoundTripper
	readyz *url.URL
}

func (t *notReadyRetry) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err != nil || resp.StatusCode != http.StatusForbidden || (req.Body != nil && req.GetBody == nil) {
		return resp, err
	}
	ctx := req.Context()
	giveUp := time.Now().Add(notReadyPatience)
	back := notReadyBackoff()
	for refusedWhileStarting(resp) && !t.ready(req) && time.Now().Before(giveUp) && pause(ctx, &back) == nil {
		again := resend(req)
		if again == nil {
			break // no fresh body: the refusal stands
		}
		next, err := t.next.RoundTrip(again)
		_ = resp.Body.Close()
		if err != nil {
			return nil, err // the outcome is unknown now, not refused: say so
		}
		resp = next
		if resp.StatusCode != http.StatusForbidden {
			break
		}
	}
	return resp, nil
}

// notReadyBackoff paces the tries while the apiserver is not ready: 50 ms at
// first, doubling to 0.5–1.5 s, as the requests of a starting apiserver's
// clients pile up.
func notReadyBackoff() wait.Backoff {
	b := retryBackoff()
	b.Duration = 50 * time.Millisecond
	return b
}

// resend is req again with a fresh body, nil if none can be had.
func resend(req *http.Request) *http.Request {
	again := req.Clone(req.Context())
	if req.GetBody != nil {
		body, err := req.GetBody()
		if err != nil {
			return nil
		}
		again.Body = body
	}
	return again
}

// ready reports whether the apiserver's /readyz passes, asked as req's user.
// Anything but a 200 is not ready: a 500 lists the checks still failing, and
// before the authorizer synced, /readyz itself is refused.
func (t *notReadyRetry) ready(req *http.Request) bool {
	ctx, cancel := context.WithTimeout(req.Context(), 5*time.Second)
	defer cancel()
	probe := req.Clone(ctx)
	probe.Method, probe.URL, probe.Host = http.MethodGet, t.readyz, ""
	probe.Body, probe.GetBody, probe.ContentLength = nil, nil, 0
	for _, h := range []string{"Content-Type", "Content-Length", "Content-Encoding"} {
		probe.Header.Del(h)
	}
	resp, err := t.next.RoundTrip(probe)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// refusedWhileStarting reports whether resp, a 403, is one a starting
// apiserver sends, not a rule's. It reads the body and puts it back.
func refusedWhileStarting(resp *http.Response) bool {
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	_ = resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	if err != nil {
		return false
	}
	var st metav1.Status
	if json.Unmarshal(body, &st) != nil || st.Reason != metav1.StatusReasonForbidden {
		return false
	}
	return !strings.Contains(st.Message, "[kubelock:") && startingRefusal.MatchString(st.Message)
}
