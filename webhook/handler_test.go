package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/rules"
)

const (
	alice = "alice"
	ctrlr = "system:serviceaccount:kubelock-system:kubelock-controller-manager"
)

// heldByAlice is a lock alice holds, with its Held condition, as her client wrote it.
func heldByAlice() *locksv1alpha1.DistributedLock {
	now := metav1.NewMicroTime(time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC))
	l := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "l", ResourceVersion: "100"}}
	l.Acquire(locksv1alpha1.LockHolder{Identity: "alice-pod", User: alice, LeaseID: "lease-a", RequestID: "req-a", LeaseDurationSeconds: 30, AcquireTime: now, RenewTime: &now}, 101)
	l.ResourceVersion = "200"
	l.Status.Conditions[0].LastTransitionTime = metav1.NewTime(now.Time)
	return l
}

// testValidator is a Validator for the controller user ctrlr that decodes
// the types add registers and creates SubjectAccessReviews with c.
func testValidator(t *testing.T, c client.Client, add ...func(*runtime.Scheme) error) *Validator {
	t.Helper()
	scheme := runtime.NewScheme()
	for _, f := range add {
		if err := f(scheme); err != nil {
			t.Fatal(err)
		}
	}
	v, err := NewValidator(scheme, c, ctrlr)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// A time Go cannot parse gets the rule's denial from the handler, not a
// decode error (which would tell the user nothing about what is accepted).
func TestHandleStatusRefusesUnparseableTimesByRule(t *testing.T) {
	v := testValidator(t, nil, locksv1alpha1.AddToScheme)
	old := heldByAlice()
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
	// The handler answers with the rules' own denial.
	want := rules.ValidateRawStatusTimes(newRaw)
	if len(want) != 1 || rules.RuleOf(want[0]) != rules.RuleTimeFormat {
		t.Fatalf("the rules say %v, want one time-format denial", want)
	}
	msg := resp.Result.Message
	if resp.Result.Code != 403 || !strings.Contains(msg, "status.conditions[0].lastTransitionTime") || !strings.Contains(msg, want[0].Detail) {
		t.Fatalf("got %d %q, want 403 with %q", resp.Result.Code, msg, want[0].Detail)
	}
}

// failingSAR is a client whose SubjectAccessReviews cannot be made.
type failingSAR struct{ client.Client }

func (failingSAR) Create(context.Context, client.Object, ...client.CreateOption) error {
	return errors.New("connection refused")
}

// A verb the rules need but the apiserver cannot answer errs the write (the
// client retries) rather than denying it.
func TestHandleErrsWhenAVerbCannotBeAsked(t *testing.T) {
	v := testValidator(t, failingSAR{}, locksv1alpha1.AddToScheme)
	raw, err := json.Marshal(heldByAlice())
	if err != nil {
		t.Fatal(err)
	}
	resp := v.Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		Operation: admissionv1.Delete, Namespace: "ns", Name: "l",
		UserInfo:  authenticationv1.UserInfo{Username: "bob"},
		OldObject: runtime.RawExtension{Raw: raw},
	}})
	if resp.Allowed || resp.Result.Code != http.StatusInternalServerError || !strings.Contains(resp.Result.Message, "connection refused") {
		t.Fatalf("got allowed=%v %d %q, want a 500 naming the failed check", resp.Allowed, resp.Result.Code, resp.Result.Message)
	}
}
