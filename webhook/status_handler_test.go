package webhook

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// A time Go cannot parse gets the rule's denial from the handler, not a
// decode error (which would tell the user nothing about what is accepted).
func TestHandleStatusRefusesUnparseableTimesByRule(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := locksv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	v, err := NewValidator(scheme, nil, ctrlr)
	if err != nil {
		t.Fatal(err)
	}
	old := heldBy(alice)
	oldRaw, err := json.Marshal(old)
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := json.Unmarshal(oldRaw, &obj); err != nil {
		t.Fatal(err)
	}
	conds := obj["status"].(map[string]any)["conditions"].([]any)
	conds[0].(map[string]any)["lastTransitionTime"] = "2026-11-29t09:00:00z"
	newRaw, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	resp := v.Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		Operation: admissionv1.Update, SubResource: "status",
		UserInfo:  authenticationv1.UserInfo{Username: alice},
		Object:    runtime.RawExtension{Raw: newRaw}, OldObject: runtime.RawExtension{Raw: oldRaw},
	}})
	if resp.Allowed {
		t.Fatal("allowed a lastTransitionTime Go cannot parse")
	}
	msg := resp.Result.Message
	if resp.Result.Code != 403 || !strings.Contains(msg, "status.conditions[0].lastTransitionTime") || !strings.Contains(msg, "[kubelock:time-format] "+msgTime) {
		t.Fatalf("got %d %q, want 403 with the time-format rule", resp.Result.Code, msg)
	}
}
