package webhook

import (
	"context"
	"fmt"
	"net/http"
	"slices"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/internal/metrics"
	"github.com/kubelock/kubelock/rules"
)

// FencedPath is where the webhook server serves the fenced-object validator.
const FencedPath = "/validate-fenced-object"

// The fenced-object validator reads the namespace of a refused DELETE.
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get

// Fenced is the admission handler for objects fenced by a lock. It reads the
// guarding locks, asks SubjectAccessReviews, and reads the namespace of a
// refused DELETE (a namespace being deleted is emptied by the namespace
// controller, which holds no lock).
func (v *Validator) Fenced() admission.Handler { return fencedHandler{v} }

type fencedHandler struct{ v *Validator }

// Handle validates one CREATE, UPDATE or DELETE of a possibly fenced object.
func (h fencedHandler) Handle(ctx context.Context, req admission.Request) admission.Response {
	v := h.v
	oldObj, err := v.decodeIf(req.Operation != admissionv1.Create, req.OldObject.Raw)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	newObj, err := v.decodeIf(req.Operation != admissionv1.Delete, req.Object.Raw)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	name := rules.GuardingLock(oldObj, newObj)
	if name == "" {
		return respond(nil)
	}
	errs, lock, err := v.validateFenced(ctx, req, oldObj, newObj, name)
	switch {
	case err != nil:
		return admission.Errored(http.StatusInternalServerError, err)
	case rules.Failed(errs):
		return answer(errs, nil)
	}
	if len(errs) > 0 && req.Operation == admissionv1.Delete {
		// The namespace controller empties a namespace that is being deleted;
		// nobody can create in it any more, so its fenced objects may go.
		n := &corev1.Namespace{}
		if err := v.reader.Get(ctx, client.ObjectKey{Name: req.Namespace}, n); err != nil {
			return admission.Errored(http.StatusInternalServerError, fmt.Errorf("webhook: reading namespace %s: %w", req.Namespace, err))
		}
		if n.DeletionTimestamp != nil {
			metrics.AdmissionDecision("", true)
			return admission.Allowed("namespace " + req.Namespace + " is being deleted")
		}
	}
	countStaleToken(req.Namespace, name, lock, errs)
	return respond(errs)
}

// validateFenced checks a write of an object fenced by the lock name: its
// annotations first, so that only a lock's name is ever read, then the write
// against the lock (lock: what was read, nil if nothing was).
func (v *Validator) validateFenced(ctx context.Context, req admission.Request, oldObj, newObj metav1.Object, name string) (errs field.ErrorList, lock *rules.FencedLock, err error) {
	if errs := rules.ValidateFencedBy(oldObj, newObj); len(errs) > 0 {
		return errs, nil, nil
	}
	l, err := v.readLock(ctx, req.Namespace, name)
	if err != nil {
		return nil, nil, err
	}
	return rules.ValidateFencedWrite(rules.Operation(req.Operation), oldObj, newObj, l, v.actor(ctx, req.UserInfo)), &l, nil
}

// countStaleToken counts a write denied for a stale token in the series of
// the guarding lock, if it was read and exists: a name no lock has gets no
// series, and a lock found gone loses its own.
func countStaleToken(namespace, name string, lock *rules.FencedLock, errs field.ErrorList) {
	switch {
	case lock == nil:
	case !lock.Exists:
		metrics.Hot.Forget(namespace, name)
	case slices.ContainsFunc(errs, func(e *field.Error) bool { return rules.RuleOf(e) == rules.RuleStaleToken }):
		metrics.Hot.StaleToken(namespace, name)
	}
}

// decodeIf decodes raw when the operation has that object; nil otherwise
// (an untyped nil, so that callers can test for it).
func (v *Validator) decodeIf(has bool, raw []byte) (metav1.Object, error) {
	if !has || len(raw) == 0 {
		return nil, nil
	}
	u := &unstructured.Unstructured{}
	if err := v.decoder.DecodeRaw(runtime.RawExtension{Raw: raw}, u); err != nil {
		return nil, err
	}
	return u, nil
}

func (v *Validator) readLock(ctx context.Context, ns, name string) (rules.FencedLock, error) {
	l := &locksv1alpha1.DistributedLock{}
	switch err := v.reader.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, l); {
	case apierrors.IsNotFound(err):
		return rules.FencedLock{}, nil
	case err != nil:
		return rules.FencedLock{}, fmt.Errorf("webhook: reading lock %s/%s: %w", ns, name, err)
	}
	f := rules.FencedLock{Exists: true, Token: l.Status.FencingToken}
	if h := l.Status.Holder; h != nil {
		f.HolderUser, f.HolderPodUID = h.User, h.PodUID
	}
	return f, nil
}
