package webhook

import (
	"context"
	"fmt"
	"net/http"
	"slices"

	admissionv1 "k8s.io/api/admission/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// SessionPath is where the webhook server serves the session validator.
const SessionPath = "/validate-locks-kubelock-io-v1alpha1-locksession"

// Every write of a LockSession, main resource and status.
// +kubebuilder:webhook:path=/validate-locks-kubelock-io-v1alpha1-locksession,mutating=false,failurePolicy=fail,sideEffects=None,groups=locks.kubelock.io,resources=locksessions;locksessions/status,verbs=create;update;delete,versions=v1alpha1,name=vlocksession.kubelock.io,admissionReviewVersions=v1,timeoutSeconds=5
// The lock validator reads the sessions holdings and waiters name.
// +kubebuilder:rbac:groups=locks.kubelock.io,resources=locksessions,verbs=get;list;watch

// Sessions is the admission handler for LockSessions.
func (v *Validator) Sessions() admission.Handler { return sessionHandler{v} }

type sessionHandler struct{ v *Validator }

func (h sessionHandler) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation == admissionv1.Connect {
		return respond(nil)
	}
	v := h.v
	oldObj, newObj := &locksv1alpha1.LockSession{}, &locksv1alpha1.LockSession{}
	if err := v.decode(req, oldObj, newObj); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	a := SessionActor{Actor: v.actor(req.UserInfo), IsGarbageCollector: slices.Contains(DefaultGarbageCollectors, req.UserInfo.Username)}
	switch {
	case req.Operation == admissionv1.Create:
		return respond(ValidateSessionCreate(newObj, a.Actor))
	case req.Operation == admissionv1.Update && req.SubResource == "status":
		return respond(ValidateSessionStatus(oldObj, newObj, a.Actor))
	case req.Operation == admissionv1.Update:
		return respond(ValidateSessionUpdate(oldObj, newObj, a))
	}
	var err error
	if user, pod := a.owns(oldObj); !(user && pod) && !a.IsController && !a.IsGarbageCollector {
		a.CanForceRelease, err = v.can(ctx, req.UserInfo, locksv1alpha1.LockSessionsResource, req.Namespace, req.Name, locksv1alpha1.ForceReleaseVerb)
	}
	return answer(ValidateSessionDelete(oldObj, a), err)
}

// sessionRefErrors checks the session fields of a lock's status write,
// reading each session it newly names from the apiserver.
func (v *Validator) sessionRefErrors(ctx context.Context, oldObj, newObj *locksv1alpha1.DistributedLock, a Actor) (field.ErrorList, error) {
	sessions := map[string]*locksv1alpha1.LockSession{}
	for _, name := range SessionsNamed(oldObj, newObj) {
		s := &locksv1alpha1.LockSession{}
		switch err := v.reader.Get(ctx, client.ObjectKey{Namespace: oldObj.Namespace, Name: name}, s); {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return nil, fmt.Errorf("webhook: reading session %s: %w", name, err)
		}
		sessions[name] = s
	}
	return ValidateSessionRefs(oldObj, newObj, a, sessions), nil
}
