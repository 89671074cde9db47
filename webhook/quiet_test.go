package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

type fixed admission.Response

func (f fixed) Handle(context.Context, admission.Request) admission.Response {
	return admission.Response(f)
}

func TestQuietKeepsDenialsAndHidesErrors(t *testing.T) {
	secret := `parsing time "2026-01-01T00:00:00Z": lock token 4711`
	for _, c := range []struct {
		name     string
		in       admission.Response
		wantCode int32
		wantMsg  string
	}{
		{"allowed", admission.Allowed(""), http.StatusOK, ""},
		{"denied", admission.Denied("[kubelock:holder-only] only the holder may release"), http.StatusForbidden, "[kubelock:holder-only] only the holder may release"},
		{"undecodable", admission.Errored(http.StatusBadRequest, errors.New(secret)), http.StatusBadRequest, MsgUndecodable},
		{"internal", admission.Errored(http.StatusInternalServerError, errors.New(secret)), http.StatusInternalServerError, MsgInternalError},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := Quiet(fixed(c.in)).Handle(context.Background(), admission.Request{})
			if got.Allowed != c.in.Allowed || got.Result.Code != c.wantCode || got.Result.Message != c.wantMsg {
				t.Errorf("got allowed=%v code=%d message=%q, want allowed=%v code=%d message=%q",
					got.Allowed, got.Result.Code, got.Result.Message, c.in.Allowed, c.wantCode, c.wantMsg)
			}
		})
	}
}

// A stored lock whose time does not parse must not be quoted back to the writer.
func TestQuietValidatorDoesNotEchoTheStoredLock(t *testing.T) {
	v := testValidator(t, nil, locksv1alpha1.AddToScheme)
	stored := map[string]any{
		"apiVersion": locksv1alpha1.GroupVersion.String(), "kind": "DistributedLock",
		"metadata": map[string]any{"namespace": "ns", "name": "l"},
		"status": map[string]any{"fencingToken": "4711-secret", "holder": map[string]any{
			"identity": "secret-holder", "leaseID": "lease-secret", "acquireTime": "2026-01-01T00:00:00.000000Z",
		}},
	}
	raw, err := json.Marshal(stored)
	if err != nil {
		t.Fatal(err)
	}
	req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		Operation: admissionv1.Update, SubResource: "status",
		OldObject: runtime.RawExtension{Raw: raw}, Object: runtime.RawExtension{Raw: raw},
	}}
	got := Quiet(v).Handle(context.Background(), req)
	if got.Allowed || got.Result.Message != MsgUndecodable {
		t.Fatalf("got allowed=%v message=%q, want a refusal with %q", got.Allowed, got.Result.Message, MsgUndecodable)
	}
	for _, leak := range []string{"2026-01-01", "secret", "4711"} {
		if strings.Contains(got.Result.Message, leak) {
			t.Errorf("the answer quotes the stored lock (%q): %q", leak, got.Result.Message)
		}
	}
}
