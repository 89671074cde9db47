package webhook

import (
	"context"
	"fmt"
	"net/http"
	"strconv"

	admissionv1 "k8s.io/api/admission/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/internal/metrics"
)

// FencedPath is where the webhook server serves the fenced-object validator.
const FencedPath = "/validate-fenced-object"

// Annotations of Kubernetes objects protected by a lock's fencing token.
const (
	// FencedByAnnotation names the lock (in the object's namespace) that guards the object.
	FencedByAnnotation = "locks.kubelock.io/fenced-by"
	// FencingTokenAnnotation carries the writer's token; the stored value is the
	// highest token the object accepted.
	FencingTokenAnnotation = "locks.kubelock.io/fencing-token"
)

// RuleStaleToken is the fenced-object rule: a fenced object accepts only tokens
// at least as high as the highest it accepted, and never above the lock's current token.
const RuleStaleToken Rule = "stale-token"

// ValidateFencedUpdate checks an update of an object that carries the
// fenced-by annotation. lockToken is the guarding lock's status.fencingToken
// (-1 when the lock does not exist). Pure.
func ValidateFencedUpdate(oldObj, newObj metav1.Object, lockToken int64) error {
	lock := oldObj.GetAnnotations()[FencedByAnnotation]
	if lock == "" {
		return nil
	}
	tag := fmt.Sprintf("[kubelock:%s] ", RuleStaleToken)
	raw, ok := newObj.GetAnnotations()[FencingTokenAnnotation]
	if !ok {
		return fmt.Errorf("%sobject is fenced by lock %q: the update must carry the %s annotation with the holder's fencing token", tag, lock, FencingTokenAnnotation)
	}
	token, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || token <= 0 {
		return fmt.Errorf("%sannotation %s=%q is not a positive integer", tag, FencingTokenAnnotation, raw)
	}
	if prev, ok := oldObj.GetAnnotations()[FencingTokenAnnotation]; ok {
		if highest, err := strconv.ParseInt(prev, 10, 64); err == nil && token < highest {
			return fmt.Errorf("%sstale fencing token %d for lock %q: this object already accepted token %d", tag, token, lock, highest)
		}
	}
	if lockToken < 0 {
		return fmt.Errorf("%sobject is fenced by lock %q, which does not exist", tag, lock)
	}
	if token > lockToken {
		return fmt.Errorf("%sfencing token %d was never issued: lock %q is at token %d", tag, token, lock, lockToken)
	}
	return nil
}

// FencedValidator is the admission handler for objects fenced by a lock.
type FencedValidator struct {
	decoder admission.Decoder
	reader  client.Reader
}

// NewFencedValidator returns the handler; reader reads the guarding locks.
func NewFencedValidator(decoder admission.Decoder, reader client.Reader) *FencedValidator {
	metrics.Register()
	return &FencedValidator{decoder: decoder, reader: reader}
}

// Handle validates one update of a possibly fenced object.
func (v *FencedValidator) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Update {
		return admission.Allowed("")
	}
	oldObj, newObj := &unstructured.Unstructured{}, &unstructured.Unstructured{}
	if err := v.decoder.DecodeRaw(req.OldObject, oldObj); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if err := v.decoder.DecodeRaw(req.Object, newObj); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	name := oldObj.GetAnnotations()[FencedByAnnotation]
	if name == "" {
		return admission.Allowed("")
	}
	lockToken := int64(-1)
	lock := &locksv1alpha1.DistributedLock{}
	switch err := v.reader.Get(ctx, client.ObjectKey{Namespace: req.Namespace, Name: name}, lock); {
	case err == nil:
		lockToken = lock.Status.FencingToken
	case !apierrors.IsNotFound(err):
		return admission.Errored(http.StatusInternalServerError, err)
	}
	if err := ValidateFencedUpdate(oldObj, newObj, lockToken); err != nil {
		observe(RuleStaleToken, false)
		metrics.StaleTokenRejected(req.Namespace + "/" + name)
		return admission.Denied(err.Error())
	}
	observe("", true)
	return admission.Allowed("")
}
