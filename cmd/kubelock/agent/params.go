package agent

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
)

// params are the query parameters of the agent's own API.
type params struct {
	// wait: how long an acquire waits in the lock's queue (0: try once), or
	// how long a get waits for the holding to end (0: answer at once).
	wait time.Duration
	// lease: how long a holding lasts without a renewal (whole seconds).
	lease time.Duration
	// shared: acquire shared (an RWMutex's reader; a Semaphore always is).
	shared bool
	// leaseID names the holding of a get, renew or release.
	leaseID string
}

// maxWait bounds a wait: pkg/lock's bound of a wait in a queue.
const maxWait = lock.DefaultWaitTimeout

// parseQuery reads the query parameters named allowed; any other parameter,
// a repeated one or a request body is an error, so that a typo never passes
// for a default.
func parseQuery(r *http.Request, allowed ...string) (params, error) {
	var p params
	if r.ContentLength > 0 || len(r.TransferEncoding) > 0 {
		return p, errors.New("kubelock agent: parameters go in the query string (?wait=10s&lease=30s&shared=true), not in a body")
	}
	for name, values := range r.URL.Query() {
		if !slices.Contains(allowed, name) {
			return p, fmt.Errorf("kubelock agent: unknown parameter %q: %s takes %s", shown(name), r.Method, list(allowed))
		}
		if len(values) != 1 {
			return p, fmt.Errorf("kubelock agent: parameter %s is given %d times", name, len(values))
		}
		if err := p.set(name, values[0]); err != nil {
			return p, err
		}
	}
	return p, nil
}

func (p *params) set(name, value string) error {
	var err error
	switch name {
	case "wait":
		p.wait, err = parseDuration(name, value, 0, maxWait)
	case "lease":
		p.lease, err = parseDuration(name, value, time.Second, locksv1alpha1.MaxLeaseDurationSeconds*time.Second)
		if err == nil && p.lease%time.Second != 0 {
			err = fmt.Errorf("kubelock agent: lease must be whole seconds, got %s", p.lease)
		}
	case "shared":
		if p.shared, err = strconv.ParseBool(value); err != nil {
			err = fmt.Errorf("kubelock agent: shared must be true or false, got %q", shown(value))
		}
	case "leaseID":
		p.leaseID = value
	}
	return err
}

// parseDuration reads a Go duration ("10s", "1m30s") or whole seconds
// ("10") within min..max.
func parseDuration(name, value string, lo, hi time.Duration) (time.Duration, error) {
	d, err := time.ParseDuration(value)
	if n, nerr := strconv.ParseInt(value, 10, 64); nerr == nil && n >= 0 && n <= int64(hi/time.Second) {
		d, err = time.Duration(n)*time.Second, nil
	}
	if err != nil {
		return 0, fmt.Errorf("kubelock agent: %s must be a duration such as 10s or 1m, or whole seconds, got %q", name, shown(value))
	}
	if d < lo || d > hi {
		return 0, fmt.Errorf("kubelock agent: %s %s is outside %s..%s", name, d, lo, hi)
	}
	return d, nil
}

// checkKey says what is wrong with key, if anything: pkg/lock's rules, and
// text. A key arrives percent-encoded from any byte; kept in the lock's key
// annotation, shown by kubectl and in logs, it must be UTF-8 with no control
// characters (JSON would turn other bytes into U+FFFD, and the annotation
// would then name another key).
func checkKey(key string) error {
	if _, err := lock.NameForKey(key); err != nil {
		return fmt.Errorf("%w (a key is one path segment: escape / as %%2F)", err)
	}
	if !utf8.ValidString(key) {
		return errors.New("kubelock agent: lock key is not valid UTF-8")
	}
	if i := strings.IndexFunc(key, unicode.IsControl); i >= 0 {
		return fmt.Errorf("kubelock agent: lock key has a control character at byte %d: keys are text", i)
	}
	return nil
}

// list is "a, b or c".
func list(s []string) string {
	switch len(s) {
	case 0:
		return "no parameters"
	case 1:
		return s[0]
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}
