package lock

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestTooLargeIsDefinite classifies the answers the apiserver gives when a
// write would make an object larger than etcd takes, in the shapes
// kube-apiserver 1.37 sends them (a 500 with no reason; seen in
// test/integration's "a lock at the size etcd takes"), next to answers that
// must stay retryable.
func TestTooLargeIsDefinite(t *testing.T) {
	status := func(code int32, reason metav1.StatusReason, msg string) error {
		return &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: code, Reason: reason, Message: msg}}
	}
	for _, tc := range []struct {
		name     string
		err      error
		tooLarge bool
	}{
		{"etcd's --max-request-bytes", status(http.StatusInternalServerError, "", "etcdserver: request is too large"), true},
		{"the apiserver's gRPC limit", status(http.StatusInternalServerError, "", "rpc error: code = ResourceExhausted desc = trying to send message larger than max (2430493 vs. 2097152)"), true},
		{"wrapped", fmt.Errorf("writing: %w", status(http.StatusInternalServerError, "", "etcdserver: request is too large")), true},
		{"a request body over the apiserver's limit", apierrors.NewRequestEntityTooLargeError("limit is 3145728"), true},
		{"another internal error", apierrors.NewInternalError(errors.New("etcdserver: leader changed")), false},
		{"a timeout", apierrors.NewTimeoutError("request did not complete", 1), false},
		{"the message on another code", status(http.StatusConflict, metav1.StatusReasonConflict, "etcdserver: request is too large"), false},
		{"not an apiserver answer", errors.New("etcdserver: request is too large"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tooLarge(tc.err); got != tc.tooLarge {
				t.Errorf("tooLarge(%v) = %v, want %v", tc.err, got, tc.tooLarge)
			}
			if tc.tooLarge && !definite(tc.err) {
				t.Errorf("definite(%v) = false: the same write would be retried until its deadline", tc.err)
			}
		})
	}
}
