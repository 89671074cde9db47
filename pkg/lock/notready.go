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
// rules allow, and its /readyz fails. Taken as final, that 403 would fail a
// Release sent across an apiserver restart, and the lock would stay held until
// the controller expires it. So a client built by New sends again a request
// the authorizer refused while /readyz does not pass, pausing between tries,
// within the request's context (a renewal's ends at the holding's safe
// deadline) and for at most notReadyPatience. Every other 403 is answered at
// once: admission's (a [kubelock:...] rule from the webhook or the policy,
// or any other admission plugin's) and the authorizer's on a ready apiserver.

// notReadyPatience bounds how long one request is sent again while the
// apiserver is not ready. It also bounds the wait for a real denial where
// /readyz never passes for the client (an administrator who took away
// system:public-info-viewer): as long as TryAcquire retries a lost response.
const notReadyPatience = tryTimeout

// authorizerRefusal matches the message of the authorizer's 403
// (responsewriters.ForbiddenStatusError in k8s.io/apiserver): `<resource>
// "<name>" is forbidden: User "<user>" cannot <verb> resource ...`, or
// `forbidden: User "<user>" cannot <verb> path ...`, and its reason after
// it, if any. Admission's refusals start otherwise ("admission webhook ...
// denied the request", "ValidatingAdmissionPolicy ... denied request").
var authorizerRefusal = regexp.MustCompile(`^(?:\S+ (?:"(?:[^"\\]|\\.)*" )?is )?forbidden: User "(?:[^"\\]|\\.)*" cannot \S+ (?:resource|path) "`)

// retryWhileNotReady makes the clients of cfg send again a request the
// authorizer refused while the apiserver's /readyz does not pass.
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
	for {
		if !refusedByAuthorizer(resp) || t.ready(req) || time.Now().After(giveUp) || pause(ctx, &back) != nil {
			return resp, nil
		}
		again, err := resend(req)
		if err != nil {
			return resp, nil
		}
		next, err := t.next.RoundTrip(again)
		if err != nil {
			// The request's outcome is unknown now, not refused: say so.
			_ = resp.Body.Close()
			return nil, err
		}
		if next.StatusCode != http.StatusForbidden {
			_ = resp.Body.Close()
			return next, nil
		}
		_ = resp.Body.Close()
		resp = next
	}
}

// notReadyBackoff paces the tries while the apiserver is not ready: 50 ms at
// first, doubling to 0.5–1.5 s, as the requests of a starting apiserver's
// clients pile up.
func notReadyBackoff() wait.Backoff {
	b := retryBackoff()
	b.Duration = 50 * time.Millisecond
	return b
}

// resend is req again, with a fresh body.
func resend(req *http.Request) (*http.Request, error) {
	again := req.Clone(req.Context())
	if req.GetBody != nil {
		body, err := req.GetBody()
		if err != nil {
			return nil, err
		}
		again.Body = body
	}
	return again, nil
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

// refusedByAuthorizer reports whether resp, a 403, carries the authorizer's
// refusal and not admission's. It reads the body and puts it back.
func refusedByAuthorizer(resp *http.Response) bool {
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
	return !strings.Contains(st.Message, "[kubelock:") && authorizerRefusal.MatchString(st.Message)
}
