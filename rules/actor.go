package rules

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/operation"
	"k8s.io/apimachinery/pkg/api/validate"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// Actor is who writes, as the server admitting the write knows it: the
// request's user, its groups and extras (a pod-bound token names its pod
// there), whether it is the kubelock controller or Kubernetes' garbage
// collector, and an Authorizer for the verbs the rules ask about.
type Actor struct {
	// Username, Groups and Extra are the request's user. The rules read the
	// name and, in Extra, the pod binding (pod); the groups are for callers
	// and their Authorizer.
	Username string
	Groups   []string
	Extra    map[string][]string
	// IsController: the writer is one of the controller's user names; it
	// expires holdings, drops waiters and counts sessions' locks.
	IsController bool
	// IsGarbageCollector: the writer is Kubernetes' garbage collector
	// (DefaultGarbageCollectors), which deletes a gone pod's sessions.
	IsGarbageCollector bool
	// Authorizer answers the verb checks (force-release, update). The rules
	// ask only when the answer decides the write; nil allows no verb.
	Authorizer Authorizer
}

// Authorizer answers whether the writer may use a verb: the webhook asks
// kube-apiserver with a SubjectAccessReview, a server of its own its
// delegated authorizer. An error is a check that could not be made; the
// rules then fail the write (Failed), neither admitting nor denying it.
type Authorizer interface {
	Allowed(c Check) (bool, error)
}

// AuthorizerFunc is a function as an Authorizer.
type AuthorizerFunc func(Check) (bool, error)

// Allowed calls f.
func (f AuthorizerFunc) Allowed(c Check) (bool, error) { return f(c) }

// Check is one verb check: may the writer use Verb on the object Name of
// Resource (distributedlocks, locksessions) in Namespace, in the group
// locks.kubelock.io?
type Check struct {
	Verb, Resource, Namespace, Name string
}

// The verbs and resources the rules ask about.
const (
	// UpdateVerb is the RBAC verb on distributedlocks that makes a user an
	// administrator of locks: it may create them with any spec.
	UpdateVerb = "update"
	// LocksResource is DistributedLock's plural resource name.
	LocksResource = "distributedlocks"
)

// DefaultGarbageCollectors are the user names Kubernetes' garbage collector
// deletes dependents as (its service account with
// --use-service-account-credentials, else kube-controller-manager's own).
var DefaultGarbageCollectors = []string{
	"system:serviceaccount:kube-system:generic-garbage-collector",
	"system:kube-controller-manager",
}

// may asks a's Authorizer about c: the answer, or the error of a check that
// could not be made (at p).
func (a Actor) may(c Check, p *field.Path) (bool, *field.Error) {
	if a.Authorizer == nil {
		return false, nil
	}
	ok, err := a.Authorizer.Allowed(c)
	if err != nil {
		return false, field.InternalError(p, fmt.Errorf("checking the %s verb on %s %s/%s: %w", c.Verb, c.Resource, c.Namespace, c.Name, err))
	}
	return ok, nil
}

// mayIf is may when need, else no without asking: a verb check is asked only
// when its answer decides the write.
func (a Actor) mayIf(need bool, c Check, p *field.Path) (bool, *field.Error) {
	if !need {
		return false, nil
	}
	return a.may(c, p)
}

// forceRelease is the check of the force-release verb on resource namespace/name.
func forceRelease(resource, namespace, name string) Check {
	return Check{Verb: locksv1alpha1.ForceReleaseVerb, Resource: resource, Namespace: namespace, Name: name}
}

// Pod binding. A token bound to a pod (the kubelet mounts one in every pod)
// carries the pod's name and UID as user extras, and they are the only pod
// a holding, a waiter or a session may name: a token bound to no pod
// (kubectl create token, a CI token, a certificate) writes neither podName
// nor podUID. The controller reads the pod an entry names, and a pod has at
// most one entry per queue: a sibling pod's name and UID written by another
// credential of its service account would lock that pod out of the queue, and
// a podName that is no pod's name would make the controller read another URL.
// config/policy gives the same messages.
const (
	msgPodNameForm = "is not a pod's name (a DNS-1123 subdomain: lower-case letters, digits, '-' and '.', at most 253 characters)"
	msgPodUIDForm  = "is not a pod's UID (a lower-case UUID such as 0b7e4b6c-6f3a-4d5e-9c1a-2f0e8d7c6b5a)"
	// MsgNoPodToken is exported for the admission suite: both engines say it.
	MsgNoPodToken = "needs a token bound to that pod: a token bound to no pod writes neither podName nor podUID"
)

// Extra keys a bound service-account token carries.
const (
	ExtraPodName = locksv1alpha1.PodNameExtra
	ExtraPodUID  = locksv1alpha1.PodUIDExtra
)

// pod is the writer's pod as its bound token names it; both are "" when the
// token is bound to no pod.
func (a Actor) pod() (name, uid string) {
	if v := a.Extra[ExtraPodName]; len(v) > 0 {
		name = v[0]
	}
	if v := a.Extra[ExtraPodUID]; len(v) > 0 {
		uid = v[0]
	}
	return name, uid
}

// samePod reports whether a writes from the pod uid names; a holding or entry
// without a pod is anyone's of its user.
func samePod(uid string, a Actor) bool {
	_, mine := a.pod()
	return uid == "" || uid == mine
}

// validatePodFields checks the pod fields of a new holding or waiter (what
// names it in messages): they are the writer's token's, and a pod's name and
// UID in form.
func validatePodFields(p *field.Path, what, name, uid string, a Actor) field.ErrorList {
	myName, myUID := a.pod()
	var errs field.ErrorList
	if name != myName {
		errs = append(errs, deny(p.Child("podName"), RulePodBinding, "%s.podName %q %s", what, name, notTheToken(myName, "the requesting pod")))
	}
	if uid != myUID {
		errs = append(errs, deny(p.Child("podUID"), RulePodBinding, "%s.podUID %q %s", what, uid, notTheToken(myUID, "the requesting pod's UID")))
	}
	return append(errs, validatePodForm(p, what, name, uid)...)
}

// notTheToken says why a pod field is not the token's: the token names
// another (mine, called which), or none.
func notTheToken(mine, which string) string {
	if mine == "" {
		return MsgNoPodToken
	}
	return fmt.Sprintf("is not %s %q", which, mine)
}

// validatePodForm checks that a stored podName is a pod's name and a podUID a
// pod's UID, whoever wrote them.
func validatePodForm(p *field.Path, what, name, uid string) field.ErrorList {
	var errs field.ErrorList
	if name != "" && len(validation.IsDNS1123Subdomain(name)) > 0 {
		errs = append(errs, deny(p.Child("podName"), RulePodBinding, "%s.podName %q %s", what, name, msgPodNameForm))
	}
	if uid != "" && len(validate.UUID(context.Background(), operation.Operation{}, p.Child("podUID"), &uid, nil)) > 0 {
		errs = append(errs, deny(p.Child("podUID"), RulePodBinding, "%s.podUID %q %s", what, uid, msgPodUIDForm))
	}
	return errs
}
