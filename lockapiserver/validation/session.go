package validation

import (
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/validation/field"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// ValidateSession checks s against the LockSession CRD's schema.
func ValidateSession(s *locksv1alpha1.LockSession) field.ErrorList {
	e := &errs{}
	p := specPath
	e.text(p.Child("user"), s.Spec.User, 1, 512, nil)
	e.text(p.Child("identity"), s.Spec.Identity, 1, 253, identityRE)
	e.between(p.Child("ttlSeconds"), int64(s.Spec.TTLSeconds), locksv1alpha1.MinSessionTTLSeconds, locksv1alpha1.MaxSessionTTLSeconds)
	e.text(p.Child("podName"), s.Spec.PodName, 0, 253, podNameRE)
	e.text(p.Child("podUID"), s.Spec.PodUID, 0, 36, podUIDRE)
	if s.Status.RenewTime != nil {
		e.microTime(statusPath.Child("renewTime"), *s.Status.RenewTime, false)
	}
	e.atLeast(statusPath.Child("locks"), int64(s.Status.Locks), 0)
	return e.list
}

// ValidateSessionUpdate is ValidateSession of newObj and the CRD's
// transition rule: the spec never changes.
func ValidateSessionUpdate(newObj, oldObj *locksv1alpha1.LockSession) field.ErrorList {
	e := &errs{list: ValidateSession(newObj)}
	e.rule(specPath, equality.Semantic.DeepEqual(newObj.Spec, oldObj.Spec), "a session's spec is immutable")
	return e.list
}
