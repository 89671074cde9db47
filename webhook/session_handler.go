package webhook

import (
	"context"
	"fmt"
	"net/http"

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

// SetSessionReader sets where the lock validator reads the sessions that
// holdings and waiters name. Use a live reader (a manager's APIReader): a
// client acquires right after creating its session, before a cache may have
// seen it. Without it the validator reads through its client.
func (v *Validator) SetSessionReader(r client.Reader) { v.sessions = r }

// SetGarbageCollectors replaces DefaultGarbageCollectors, the user names that
// may delete any session and update its ownerReferences and finalizers.
func (v *Validator) SetGarbageCollectors(users ...string) {
	v.gc = map[string]bool{}
	for _, u := range users {
		v.gc[u] = true
	}
}

// Sessions is the admission handler for LockSessions.
func (v *Validator) Sessions() admission.Handler { return sessionHandler{v} }

type sessionHandler struct{ v *Validator }

func (h sessionHandler) Handle(ctx context.Context, req admission.Request) admission.Response {
	v := h.v
	oldObj, newObj := &locksv1alpha1.LockSession{}, &locksv1alpha1.LockSession{}
	if len(req.OldObject.Raw) > 0 {
		if err := v.decoder.DecodeRaw(req.OldObject, oldObj); err != nil {
			return admission.Errored(http.StatusBadRequest, err)
		}
	}
	if len(req.Object.Raw) > 0 {
		if err := v.decoder.DecodeRaw(req.Object, newObj); err != nil {
			return admission.Errored(http.StatusBadRequest, err)
		}
	}
	a := SessionActor{Actor: v.actor(req.UserInfo), IsGarbageCollector: v.isGarbageCollector(req.UserInfo.Username)}
	switch {
	case req.Operation == admissionv1.Create && req.SubResource == "":
		return respond(ValidateSessionCreate(newObj, a.Actor))
	case req.Operation == admissionv1.Update && req.SubResource == "status":
		return respond(ValidateSessionStatus(oldObj, newObj, a.Actor))
	case req.Operation == admissionv1.Update && req.SubResource == "":
		return respond(ValidateSessionUpdate(oldObj, newObj, a))
	case req.Operation == admissionv1.Delete && req.SubResource == "":
		if user, pod := a.owns(oldObj); !(user && pod) && !a.IsController && !a.IsGarbageCollector {
			ok, err := v.sarAllowedOn(ctx, req.UserInfo, locksv1alpha1.LockSessionsResource, req.Namespace, req.Name, locksv1alpha1.ForceReleaseVerb)
			if err != nil {
				return admission.Errored(http.StatusInternalServerError, err)
			}
			a.CanForceRelease = ok
		}
		return respond(ValidateSessionDelete(oldObj, a))
	}
	observe("", true)
	return admission.Allowed("")
}

func (v *Validator) isGarbageCollector(user string) bool {
	if v.gc == nil {
		for _, u := range DefaultGarbageCollectors {
			if u == user {
				return true
			}
		}
		return false
	}
	return v.gc[user]
}

// sessionRefErrors checks the session fields of a lock's status write,
// reading each session it newly names from the apiserver.
func (v *Validator) sessionRefErrors(ctx context.Context, oldObj, newObj *locksv1alpha1.DistributedLock, a Actor) (field.ErrorList, error) {
	names := SessionsNamed(oldObj, newObj)
	sessions := make(map[string]*locksv1alpha1.LockSession, len(names))
	r := v.sessions
	if r == nil {
		r = v.sar
	}
	for _, name := range names {
		s := &locksv1alpha1.LockSession{}
		err := r.Get(ctx, client.ObjectKey{Namespace: oldObj.Namespace, Name: name}, s)
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return nil, fmt.Errorf("webhook: reading session %s: %w", name, err)
		}
		sessions[name] = s
	}
	return ValidateSessionRefs(oldObj, newObj, a, sessions), nil
}
