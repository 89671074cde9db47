// Package webhook serves kubelock's admission rules (package rules) as
// validating webhooks for DistributedLocks, LockSessions and the objects locks
// fence: it decodes each request, makes its writer an Actor whose verbs it
// asks kube-apiserver with SubjectAccessReviews, reads what the rules need
// (the sessions a lock's write names, the lock guarding a fenced object),
// calls the rules and answers, counting each answer by rule. It validates and
// never mutates.
package webhook

import (
	"context"
	"fmt"
	"net/http"
	"slices"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/internal/metrics"
	"github.com/kubelock/kubelock/rules"
)

// Path is where the webhook server serves the lock validator.
const Path = "/validate-locks-kubelock-io-v1alpha1-distributedlock"

// Two registrations of one handler: status writes, and the main resource's
// CREATE, UPDATE and DELETE. The matchConditions keep spec edits away from the
// webhook, so `kubectl apply` of locks never waits for (or on) it: an UPDATE is
// sent only when it changes finalizers, the force-delete annotation or the
// auto-created label.
// +kubebuilder:webhook:path=/validate-locks-kubelock-io-v1alpha1-distributedlock,mutating=false,failurePolicy=fail,sideEffects=None,groups=locks.kubelock.io,resources=distributedlocks/status,verbs=update,versions=v1alpha1,name=vdistributedlock.kubelock.io,admissionReviewVersions=v1,timeoutSeconds=5
// +kubebuilder:webhook:path=/validate-locks-kubelock-io-v1alpha1-distributedlock,mutating=false,failurePolicy=fail,sideEffects=None,groups=locks.kubelock.io,resources=distributedlocks,verbs=create;update;delete,versions=v1alpha1,name=vdistributedlock-meta.kubelock.io,admissionReviewVersions=v1,timeoutSeconds=5,patch=`{"matchConditions":[{"name":"metadata-rules","expression":"request.operation != 'UPDATE' || object.metadata.?finalizers.orValue([]) != oldObject.metadata.?finalizers.orValue([]) || object.metadata.?annotations[?'locks.kubelock.io/force-delete'] != oldObject.metadata.?annotations[?'locks.kubelock.io/force-delete'] || object.metadata.?labels[?'locks.kubelock.io/auto-created'] != oldObject.metadata.?labels[?'locks.kubelock.io/auto-created']"}]}`
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// Setup registers, behind Quiet, the lock validator at Path, the session
// validator at SessionPath and the fenced-object validator at FencedPath.
// reader reads the guarding locks of fenced objects and the sessions holdings
// name (the apiserver, not a cache: the rules compare with a lock's current
// token, and a client acquires right after creating its session); c creates
// SubjectAccessReviews; controllerUsers are the controller's user names. The
// operator and the test environment both call it.
func Setup(srv ctrlwebhook.Server, scheme *runtime.Scheme, reader client.Reader, c client.Client, controllerUsers ...string) error {
	v, err := NewValidator(scheme, c, controllerUsers...)
	if err != nil {
		return err
	}
	v.reader = reader
	srv.Register(Path, &admission.Webhook{Handler: Quiet(v)})
	srv.Register(SessionPath, &admission.Webhook{Handler: Quiet(v.Sessions())})
	srv.Register(FencedPath, &admission.Webhook{Handler: Quiet(v.Fenced())})
	return nil
}

// Validator is the admission handler for DistributedLocks; Sessions and
// Fenced return those for LockSessions and fenced objects.
type Validator struct {
	decoder admission.Decoder
	// sar creates SubjectAccessReviews.
	sar client.Client
	// reader reads the sessions a lock names and the locks guarding fenced
	// objects: Setup's live reader, else sar.
	reader client.Reader
	// controllers are the user names allowed to expire holdings and drop waiters.
	controllers map[string]bool
}

// NewValidator returns the handler. c creates SubjectAccessReviews;
// controllerUsers are the controller's user names (its service account).
func NewValidator(scheme *runtime.Scheme, c client.Client, controllerUsers ...string) (*Validator, error) {
	if len(controllerUsers) == 0 {
		return nil, fmt.Errorf("webhook: at least one controller user name is required")
	}
	v := &Validator{decoder: admission.NewDecoder(scheme), sar: c, reader: c, controllers: map[string]bool{}}
	for _, u := range controllerUsers {
		v.controllers[u] = true
	}
	return v, nil
}

// Handle validates one admission request.
func (v *Validator) Handle(ctx context.Context, req admission.Request) admission.Response {
	status := req.Operation == admissionv1.Update && req.SubResource == "status"
	switch {
	case status:
		// Times Go cannot parse get the rule's denial, not a decode error.
		if errs := rules.ValidateRawStatusTimes(req.Object.Raw); len(errs) > 0 {
			return respond(errs)
		}
	case req.SubResource != "" || req.Operation == admissionv1.Connect:
		return respond(nil) // nothing else is registered
	}
	oldObj, newObj := &locksv1alpha1.DistributedLock{}, &locksv1alpha1.DistributedLock{}
	if err := v.decode(req, oldObj, newObj); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	return answer(v.validate(ctx, req, oldObj, newObj))
}

// validate judges a decoded write of a lock with the rules; an error is a
// session that could not be read.
func (v *Validator) validate(ctx context.Context, req admission.Request, oldObj, newObj *locksv1alpha1.DistributedLock) (field.ErrorList, error) {
	a := v.actor(ctx, req.UserInfo)
	switch {
	case req.Operation == admissionv1.Create:
		return rules.ValidateCreate(newObj, a), nil
	case req.Operation == admissionv1.Delete:
		return rules.ValidateDelete(oldObj, a), nil
	case req.SubResource == "" && !rules.MetadataChanged(oldObj, newObj):
		return nil, nil // a spec, label or annotation edit (the matchConditions normally keep it away)
	case req.SubResource == "":
		return rules.ValidateMetadataUpdate(oldObj, newObj, a), nil
	}
	sessions, err := v.sessionsNamed(ctx, oldObj, newObj)
	if err != nil {
		return nil, err
	}
	return append(rules.ValidateStatusUpdate(oldObj, newObj, a), rules.ValidateSessionRefs(oldObj, newObj, a, sessions)...), nil
}

// decode decodes the objects the operation has: the old one unless it is a
// CREATE, the new one unless it is a DELETE.
func (v *Validator) decode(req admission.Request, oldObj, newObj runtime.Object) error {
	if req.Operation != admissionv1.Create {
		if err := v.decoder.DecodeRaw(req.OldObject, oldObj); err != nil {
			return err
		}
	}
	if req.Operation != admissionv1.Delete {
		return v.decoder.DecodeRaw(req.Object, newObj)
	}
	return nil
}

// actor is the writer of req as the rules see it; its verbs are asked of
// kube-apiserver with SubjectAccessReviews, only when a rule needs the answer.
func (v *Validator) actor(ctx context.Context, u authenticationv1.UserInfo) rules.Actor {
	return rules.Actor{
		Username: u.Username, Groups: u.Groups, Extra: extra(u.Extra),
		IsController:       v.controllers[u.Username],
		IsGarbageCollector: slices.Contains(rules.DefaultGarbageCollectors, u.Username),
		Authorizer:         rules.AuthorizerFunc(func(c rules.Check) (bool, error) { return v.can(ctx, u, c) }),
	}
}

// can asks with a SubjectAccessReview whether u may do c.
func (v *Validator) can(ctx context.Context, u authenticationv1.UserInfo, c rules.Check) (bool, error) {
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: u.Username, UID: u.UID, Groups: u.Groups, Extra: sarExtra(u.Extra),
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: c.Namespace, Verb: c.Verb, Group: locksv1alpha1.GroupVersion.Group, Resource: c.Resource, Name: c.Name,
		},
	}}
	if err := v.sar.Create(ctx, sar); err != nil {
		return false, fmt.Errorf("webhook: SubjectAccessReview: %w", err)
	}
	return sar.Status.Allowed, nil
}

// answer turns what a handler found into an admission response: an error,
// or rules that could not judge the write (a verb that could not be asked),
// errs; otherwise respond.
func answer(errs field.ErrorList, err error) admission.Response {
	switch {
	case err != nil:
		return admission.Errored(http.StatusInternalServerError, err)
	case rules.Failed(errs):
		return admission.Errored(http.StatusInternalServerError, errs.ToAggregate())
	}
	return respond(errs)
}

// respond turns the rule errors into an admission response and counts it by
// rule (kubelock_webhook_admission_decisions_total, internal/metrics).
func respond(errs field.ErrorList) admission.Response {
	if len(errs) == 0 {
		metrics.AdmissionDecision("", true)
		return admission.Allowed("")
	}
	for _, e := range errs {
		metrics.AdmissionDecision(string(rules.RuleOf(e)), false)
	}
	return admission.Denied(errs.ToAggregate().Error())
}

func extra(in map[string]authenticationv1.ExtraValue) map[string][]string {
	out := make(map[string][]string, len(in))
	for k, v := range in {
		out[k] = v
	}
	return out
}

func sarExtra(in map[string]authenticationv1.ExtraValue) map[string]authorizationv1.ExtraValue {
	out := make(map[string]authorizationv1.ExtraValue, len(in))
	for k, v := range in {
		out[k] = authorizationv1.ExtraValue(v)
	}
	return out
}

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
	oldObj, newObj := &locksv1alpha1.LockSession{}, &locksv1alpha1.LockSession{}
	if err := h.v.decode(req, oldObj, newObj); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	a := h.v.actor(ctx, req.UserInfo)
	switch {
	case req.Operation == admissionv1.Create:
		return answer(rules.ValidateSessionCreate(newObj, a), nil)
	case req.Operation == admissionv1.Update && req.SubResource == "status":
		return answer(rules.ValidateSessionStatus(oldObj, newObj, a), nil)
	case req.Operation == admissionv1.Update:
		return answer(rules.ValidateSessionUpdate(oldObj, newObj, a), nil)
	}
	return answer(rules.ValidateSessionDelete(oldObj, a), nil)
}

// sessionsNamed reads from the apiserver each session a lock's status write
// newly names; a session that does not exist has no entry.
func (v *Validator) sessionsNamed(ctx context.Context, oldObj, newObj *locksv1alpha1.DistributedLock) (map[string]*locksv1alpha1.LockSession, error) {
	sessions := map[string]*locksv1alpha1.LockSession{}
	for _, name := range rules.SessionsNamed(oldObj, newObj) {
		s := &locksv1alpha1.LockSession{}
		switch err := v.reader.Get(ctx, client.ObjectKey{Namespace: oldObj.Namespace, Name: name}, s); {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return nil, fmt.Errorf("webhook: reading session %s: %w", name, err)
		}
		sessions[name] = s
	}
	return sessions, nil
}

// Quiet wraps an admission handler so that its errors never echo what it
// read: an error (not a denial) answers with a fixed message per status code,
// and the detail — which may quote the object or the stored lock, e.g. a
// time that failed to parse — goes to the operator's log only. Denials keep
// their rule messages. Register every handler through it.
func Quiet(h admission.Handler) admission.Handler { return quiet{h} }

type quiet struct{ h admission.Handler }

// Generic messages of errored admission responses.
const (
	MsgUndecodable   = "kubelock webhook: the object could not be decoded"
	MsgInternalError = "kubelock webhook: internal error; the operator's log has the details"
)

func (q quiet) Handle(ctx context.Context, req admission.Request) admission.Response {
	resp := q.h.Handle(ctx, req)
	r := resp.Result
	if resp.Allowed || r == nil || r.Reason == metav1.StatusReasonForbidden {
		return resp
	}
	logf.FromContext(ctx).WithName("webhook").Info("admission request errored",
		"uid", req.UID, "kind", req.Kind, "namespace", req.Namespace, "name", req.Name,
		"operation", req.Operation, "code", r.Code, "error", r.Message)
	msg := MsgInternalError
	if r.Code == http.StatusBadRequest {
		msg = MsgUndecodable
	}
	resp.Result = &metav1.Status{Code: r.Code, Message: msg}
	return resp
}
