package lock

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// The messages below are kube-apiserver 1.37's, as a restarted one sent them
// to a lock user before and after its RBAC informers synced, as its admission
// plugins word theirs before their configuration is loaded, and as the
// admission engines word a rule's refusal.
const (
	rbacNotSynced    = `distributedlocks.locks.kubelock.io "a" is forbidden: User "alice" cannot update resource "distributedlocks/status" in API group "locks.kubelock.io" in the namespace "ns"`
	rbacHalfSynced   = rbacNotSynced + `: rbac: RBAC: [clusterrole.rbac.authorization.k8s.io "lock-user" not found]`
	pathRefused      = `forbidden: User "alice" cannot get path "/readyz"`
	admissionLoading = `distributedlocks.locks.kubelock.io "a" is forbidden: not yet ready to handle request`
	webhookRefusal   = `admission webhook "vdistributedlock.kubelock.io" denied the request: [kubelock:holder-only] only the holder (user "bob") may renew or release this holding`
	policyRefusal    = `ValidatingAdmissionPolicy 'kubelock-distributedlock-status' with binding 'kubelock-distributedlock-status' denied request: [kubelock:holder-only] only the holder may renew or release this holding`
	namespaceEnding  = `distributedlocks.locks.kubelock.io "a" is forbidden: unable to create new content in namespace ns because it is being terminated`
	quotaExceeded    = `distributedlocks.locks.kubelock.io "a" is forbidden: exceeded quota: locks, requested: count/distributedlocks.locks.kubelock.io=1, used: count/distributedlocks.locks.kubelock.io=10, limited: count/distributedlocks.locks.kubelock.io=10`
	ruleInAuthzShape = `forbidden: User "alice" cannot update resource "x" in API group "" [kubelock:holder-only]`
)

func TestRefusedWhileStartingTellsAStartingApiserverFromARule(t *testing.T) {
	for _, tc := range []struct {
		msg  string
		want bool
	}{
		{rbacNotSynced, true},
		{rbacHalfSynced, true},
		{pathRefused, true},
		{admissionLoading, true},
		{`admission webhook "vdistributedlock.kubelock.io" denied the request: forbidden: not yet ready to handle request`, false},
		{admissionLoading + ` [kubelock:holder-only]`, false},
		{`distributedlocks.locks.kubelock.io is forbidden: User "system:serviceaccount:ns:app" cannot create resource "distributedlocks" in API group "locks.kubelock.io" in the namespace "ns"`, true},
		{webhookRefusal, false},
		{policyRefusal, false},
		{namespaceEnding, false},
		{quotaExceeded, false},
		{ruleInAuthzShape, false},
	} {
		resp := forbidden(tc.msg)
		if got := refusedWhileStarting(resp); got != tc.want {
			t.Errorf("refusedWhileStarting(%q) = %v, want %v", tc.msg, got, tc.want)
		}
		body, _ := io.ReadAll(resp.Body)
		if !strings.Contains(string(body), `"message"`) {
			t.Errorf("the body was not put back: %q", body)
		}
	}
}

// apiserver answers the lock write with refusals while they last, then 200,
// and /readyz with readyz's answers in turn, the last one from then on.
type apiserver struct {
	t *testing.T
	// refusals are the messages of the 403s the write gets first.
	refusals []string
	// readyz are /readyz's status codes, in turn.
	readyz []int
	// hangUpAfter, when > 0, makes the write that many calls in cut the connection.
	hangUpAfter int
	// cancelAt, when > 0, ends the caller's context during that write.
	cancelAt int

	mu            sync.Mutex
	writes, polls int
	cancel        context.CancelFunc
}

const lockBody = `{"status":{"holder":{"leaseID":"l"}}}`

func (a *apiserver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if got := r.Header.Get("Authorization"); got != "Bearer alice" {
		a.t.Errorf("%s %s as %q, want alice's token", r.Method, r.URL.Path, got)
	}
	if r.URL.Path == "/readyz" {
		code := a.readyz[min(a.polls, len(a.readyz)-1)]
		a.polls++
		w.WriteHeader(code)
		return
	}
	a.writes++
	if body, _ := io.ReadAll(r.Body); string(body) != lockBody {
		a.t.Errorf("write %d sent %q, want %q", a.writes, body, lockBody)
	}
	if a.writes == a.hangUpAfter {
		panic(http.ErrAbortHandler)
	}
	if a.writes == a.cancelAt {
		a.cancel()
	}
	if a.writes <= len(a.refusals) {
		writeStatus(w, a.refusals[a.writes-1])
		return
	}
	_, _ = io.WriteString(w, lockBody)
}

func (a *apiserver) counts() (writes, polls int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.writes, a.polls
}

// write sends the lock write to a through a client built as New builds its
// own, within timeout.
func (a *apiserver) write(timeout time.Duration) (*http.Response, error) {
	srv := httptest.NewServer(a)
	a.t.Cleanup(srv.Close)
	cfg := &rest.Config{Host: srv.URL, BearerToken: "alice"}
	if err := retryWhileNotReady(cfg); err != nil {
		a.t.Fatal(err)
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		a.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	a.t.Cleanup(cancel)
	a.mu.Lock()
	a.cancel = cancel
	a.mu.Unlock()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, srv.URL+"/apis/locks.kubelock.io/v1alpha1/namespaces/ns/distributedlocks/a/status", strings.NewReader(lockBody))
	if err != nil {
		a.t.Fatal(err)
	}
	return hc.Do(req)
}

func TestAStartingApiserversRefusalIsSentAgainUntilItIsReady(t *testing.T) {
	a := &apiserver{t: t, refusals: []string{rbacNotSynced, rbacHalfSynced, admissionLoading}, readyz: []int{http.StatusForbidden, http.StatusInternalServerError, http.StatusInternalServerError, http.StatusOK}}
	resp, err := a.write(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("answer %d, want 200: the write sent again once the authorizer allowed it", resp.StatusCode)
	}
	if writes, polls := a.counts(); writes != 4 || polls != 3 {
		t.Errorf("%d writes and %d /readyz polls, want 4 and 3", writes, polls)
	}
}

func TestARealRefusalIsFinalAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name      string
		msg       string
		readyz    int
		wantPolls int
	}{
		{"a webhook rule while the apiserver is not ready", webhookRefusal, http.StatusInternalServerError, 0},
		{"a policy rule while the apiserver is not ready", policyRefusal, http.StatusInternalServerError, 0},
		{"another admission plugin while the apiserver is not ready", namespaceEnding, http.StatusInternalServerError, 0},
		{"RBAC on a ready apiserver", rbacNotSynced, http.StatusOK, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &apiserver{t: t, refusals: []string{tc.msg}, readyz: []int{tc.readyz}}
			resp, err := a.write(time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if got := statusMessage(t, resp); resp.StatusCode != http.StatusForbidden || got != tc.msg {
				t.Errorf("answer %d %q, want the 403 %q", resp.StatusCode, got, tc.msg)
			}
			if writes, polls := a.counts(); writes != 1 || polls != tc.wantPolls {
				t.Errorf("%d writes and %d /readyz polls, want 1 and %d", writes, polls, tc.wantPolls)
			}
		})
	}
}

func TestTheRetriesEndWithTheRequestsContext(t *testing.T) {
	a := &apiserver{t: t, refusals: []string{rbacNotSynced, rbacNotSynced, rbacNotSynced, rbacNotSynced}, readyz: []int{http.StatusInternalServerError}, cancelAt: 3}
	resp, err := a.write(time.Minute)
	switch {
	case errors.Is(err, context.Canceled):
		// The context ended before the third answer came back.
	case err != nil:
		t.Fatal(err)
	default:
		if got := statusMessage(t, resp); resp.StatusCode != http.StatusForbidden || got != rbacNotSynced {
			t.Errorf("answer %d %q, want the last 403", resp.StatusCode, got)
		}
	}
	if writes, _ := a.counts(); writes != 3 {
		t.Errorf("%d writes, want 3: none after the context ended in the third", writes)
	}
}

func TestARetryWithoutAnAnswerIsUnknownNotRefused(t *testing.T) {
	a := &apiserver{t: t, refusals: []string{rbacNotSynced}, readyz: []int{http.StatusInternalServerError}, hangUpAfter: 2}
	resp, err := a.write(time.Minute)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("answer %d, want the cut connection's error: the second write may have committed", resp.StatusCode)
	}
}

func forbidden(msg string) *http.Response {
	rec := httptest.NewRecorder()
	writeStatus(rec, msg)
	return rec.Result()
}

func writeStatus(w http.ResponseWriter, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusForbidden)
	_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status: metav1.StatusFailure, Message: msg, Reason: metav1.StatusReasonForbidden, Code: http.StatusForbidden})
}

func statusMessage(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	var st metav1.Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st.Message
}
