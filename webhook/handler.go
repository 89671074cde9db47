package webhook

import (
	"context"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// Path is where the webhook server serves the lock validator.
const Path = "/validate-locks-kubelock-io-v1alpha1-distributedlock"

// Two registrations of one handler: status writes, and the main resource's
// CREATE, UPDATE and DELETE. The matchConditions keep spec edits away from the
// webhook, so `kubectl apply` of locks never waits for (or on) it: an UPDATE is
// sent only when it changes finalizers or the force-delete annotation.
// +kubebuilder:webhook:path=/validate-locks-kubelock-io-v1alpha1-distributedlock,mutating=false,failurePolicy=fail,sideEffects=None,groups=locks.kubelock.io,resources=distributedlocks/status,verbs=update,versions=v1alpha1,name=vdistributedlock.kubelock.io,admissionReviewVersions=v1,timeoutSeconds=5
// +kubebuilder:webhook:path=/validate-locks-kubelock-io-v1alpha1-distributedlock,mutating=false,failurePolicy=fail,sideEffects=None,groups=locks.kubelock.io,resources=distributedlocks,verbs=create;update;delete,versions=v1alpha1,name=vdistributedlock-meta.kubelock.io,admissionReviewVersions=v1,timeoutSeconds=5,patch=`{"matchConditions":[{"name":"metadata-rules","expression":"request.operation != 'UPDATE' || object.metadata.?finalizers.orValue([]) != oldObject.metadata.?finalizers.orValue([]) || object.metadata.?annotations[?'locks.kubelock.io/force-delete'] != oldObject.metadata.?annotations[?'locks.kubelock.io/force-delete']"}]}`
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
	v.SetSessionReader(reader)
	srv.Register(Path, &admission.Webhook{Handler: Quiet(v)})
	srv.Register(SessionPath, &admission.Webhook{Handler: Quiet(v.Sessions())})
	srv.Register(FencedPath, &admission.Webhook{Handler: Quiet(NewFencedValidator(admission.NewDecoder(scheme), reader, c))})
	return nil
}

// Validator is the admission handler for DistributedLocks.
type Validator struct {
	decoder admission.Decoder
	// sar creates SubjectAccessReviews for the force-release and update verbs.
	sar client.Client
	// controllers are the user names allowed to expire holdings and drop waiters.
	controllers map[string]bool
	// sessions reads the sessions holdings and waiters name; gc are the
	// garbage collector's user names (session_handler.go).
	sessions client.Reader
	gc       map[string]bool
}

// NewValidator returns the handler. c creates SubjectAccessReviews;
// controllerUsers are the controller's user names (its service account).
func NewValidator(scheme *runtime.Scheme, c client.Client, controllerUsers ...string) (*Validator, error) {
	if len(controllerUsers) == 0 {
		return nil, fmt.Errorf("webhook: at least one controller user name is required")
	}
	v := &Validator{decoder: admission.NewDecoder(scheme), sar: c, controllers: map[string]bool{}}
	for _, u := range controllerUsers {
		v.controllers[u] = true
	}
	return v, nil
}

// Handle validates one admission request.
func (v *Validator) Handle(ctx context.Context, req admission.Request) admission.Response {
	switch {
	case req.Operation == admissionv1.Update && req.SubResource == "status":
		return v.handleStatus(ctx, req)
	case req.Operation == admissionv1.Delete && req.SubResource == "":
		return v.handleDelete(ctx, req)
	case req.Operation == admissionv1.Create && req.SubResource == "":
		return v.handleCreate(ctx, req)
	case req.Operation == admissionv1.Update && req.SubResource == "":
		return v.handleMetadataUpdate(ctx, req)
	default:
		// Nothing else is registered.
		observe("", true)
		return admission.Allowed("")
	}
}

func (v *Validator) handleStatus(ctx context.Context, req admission.Request) admission.Response {
	// Times Go cannot parse get the rule's denial, not a decode error.
	if errs := ValidateRawStatusTimes(req.Object.Raw); len(errs) > 0 {
		return respond(errs)
	}
	oldObj, newObj := &locksv1alpha1.DistributedLock{}, &locksv1alpha1.DistributedLock{}
	if err := v.decoder.DecodeRaw(req.OldObject, oldObj); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if err := v.decoder.DecodeRaw(req.Object, newObj); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	a := v.actor(req.UserInfo)
	if NeedsForceCheck(oldObj, newObj) {
		ok, err := v.canForceRelease(ctx, req.UserInfo, oldObj)
		if err != nil {
			return admission.Errored(http.StatusInternalServerError, err)
		}
		a.CanForceRelease = ok
	}
	sessionErrs, err := v.sessionRefErrors(ctx, oldObj, newObj, a)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	return respond(append(ValidateStatusUpdate(oldObj, newObj, a), sessionErrs...))
}

func (v *Validator) handleDelete(ctx context.Context, req admission.Request) admission.Response {
	oldObj := &locksv1alpha1.DistributedLock{}
	if err := v.decoder.DecodeRaw(req.OldObject, oldObj); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	a := v.actor(req.UserInfo)
	if oldObj.Status.Holder != nil && oldObj.Annotations[locksv1alpha1.ForceDeleteAnnotation] != "true" {
		ok, err := v.canForceRelease(ctx, req.UserInfo, oldObj)
		if err != nil {
			return admission.Errored(http.StatusInternalServerError, err)
		}
		a.CanForceRelease = ok
	}
	return respond(ValidateDelete(oldObj, a))
}

// handleCreate asks the apiserver only what the lock's contents make relevant:
// a default lock (what pkg/lock auto-creates) costs no SubjectAccessReview.
func (v *Validator) handleCreate(ctx context.Context, req admission.Request) admission.Response {
	obj := &locksv1alpha1.DistributedLock{}
	if err := v.decoder.DecodeRaw(req.Object, obj); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	a, err := v.metaActor(ctx, req, CreateChecks(obj))
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	return respond(ValidateCreate(obj, a))
}

func (v *Validator) handleMetadataUpdate(ctx context.Context, req admission.Request) admission.Response {
	oldObj, newObj := &locksv1alpha1.DistributedLock{}, &locksv1alpha1.DistributedLock{}
	if err := v.decoder.DecodeRaw(req.OldObject, oldObj); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if err := v.decoder.DecodeRaw(req.Object, newObj); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if !MetadataChanged(oldObj, newObj) {
		// A spec or label edit (the matchConditions normally keep it away).
		observe("", true)
		return admission.Allowed("")
	}
	a, err := v.metaActor(ctx, req, UpdateChecks(oldObj, newObj))
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	return respond(ValidateMetadataUpdate(oldObj, newObj, a))
}

// metaActor is the writer with the SubjectAccessReviews c asks for.
func (v *Validator) metaActor(ctx context.Context, req admission.Request, c MetaChecks) (MetaActor, error) {
	a := MetaActor{Actor: v.actor(req.UserInfo)}
	var err error
	if c.ForceRelease {
		if a.CanForceRelease, err = v.can(ctx, req, locksv1alpha1.ForceReleaseVerb); err != nil {
			return a, err
		}
	}
	if c.Update {
		if a.CanUpdate, err = v.can(ctx, req, UpdateVerb); err != nil {
			return a, err
		}
	}
	return a, nil
}

func (v *Validator) actor(u authenticationv1.UserInfo) Actor {
	return Actor{Username: u.Username, Extra: extra(u.Extra), IsController: v.controllers[u.Username]}
}

// canForceRelease asks the apiserver whether u has the force-release verb on lock.
func (v *Validator) canForceRelease(ctx context.Context, u authenticationv1.UserInfo, lock *locksv1alpha1.DistributedLock) (bool, error) {
	return v.sarAllowed(ctx, u, lock.Namespace, lock.Name, locksv1alpha1.ForceReleaseVerb)
}

// can asks the apiserver whether the request's user has verb on the request's lock.
func (v *Validator) can(ctx context.Context, req admission.Request, verb string) (bool, error) {
	return v.sarAllowed(ctx, req.UserInfo, req.Namespace, req.Name, verb)
}

// sarAllowed asks with a SubjectAccessReview whether u has verb on lock namespace/name.
func (v *Validator) sarAllowed(ctx context.Context, u authenticationv1.UserInfo, namespace, name, verb string) (bool, error) {
	return v.sarAllowedOn(ctx, u, "distributedlocks", namespace, name, verb)
}

// sarAllowedOn asks with a SubjectAccessReview whether u has verb on resource namespace/name.
func (v *Validator) sarAllowedOn(ctx context.Context, u authenticationv1.UserInfo, resource, namespace, name, verb string) (bool, error) {
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:   u.Username,
		UID:    u.UID,
		Groups: u.Groups,
		Extra:  sarExtra(u.Extra),
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: namespace,
			Verb:      verb,
			Group:     locksv1alpha1.GroupVersion.Group,
			Resource:  resource,
			Name:      name,
		},
	}}
	if err := v.sar.Create(ctx, sar); err != nil {
		return false, fmt.Errorf("webhook: checking the %s verb with a SubjectAccessReview: %w", verb, err)
	}
	return sar.Status.Allowed, nil
}

// respond turns the rule errors into an admission response and counts it by rule.
func respond(errs field.ErrorList) admission.Response {
	if len(errs) == 0 {
		observe("", true)
		return admission.Allowed("")
	}
	for _, e := range errs {
		observe(ruleOf(e), false)
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
