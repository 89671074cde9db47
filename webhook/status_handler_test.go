package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	old.Status.Conditions[0].LastTransitionTime = metav1.NewTime(now.Time)
	oldRaw, err := json.Marshal(old)
	if err != nil {
		t.Fatal(err)
	}
	good := []byte(`"lastTransitionTime":"2026-11-29T09:00:00Z"`)
	if !bytes.Contains(oldRaw, good) {
		t.Fatalf("%s lacks %s", oldRaw, good)
	}
	newRaw := bytes.Replace(oldRaw, good, []byte(`"lastTransitionTime":"2026-11-29t09:00:00z"`), 1)
	resp := v.Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		Operation: admissionv1.Update, SubResource: "status",
		UserInfo: authenticationv1.UserInfo{Username: alice},
		Object:   runtime.RawExtension{Raw: newRaw}, OldObject: runtime.RawExtension{Raw: oldRaw},
	}})
	if resp.Allowed {
		t.Fatal("allowed a lastTransitionTime Go cannot parse")
	}
	msg := resp.Result.Message
	if resp.Result.Code != 403 || !strings.Contains(msg, "status.conditions[0].lastTransitionTime") || !strings.Contains(msg, "[kubelock:time-format] "+msgTime) {
		t.Fatalf("got %d %q, want 403 with the time-format rule", resp.Result.Code, msg)
	}
}
