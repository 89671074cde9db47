package webhook

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/operation"
	"k8s.io/apimachinery/pkg/api/validate"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

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

// samePod reports whether a writes from the pod uid names; a holding or entry
// without a pod is anyone's of its user.
func samePod(uid string, a Actor) bool {
	_, mine := a.pod()
	return uid == "" || uid == mine
}
