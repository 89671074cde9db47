package rules

import (
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// Fixed messages of the session rules; config/policy's session policy gives
// the same words.
const (
	msgSessionPod = "a session created with a pod-bound token must name that pod: spec.podName and spec.podUID equal " +
		"the token's, and metadata.ownerReferences is exactly one {apiVersion: v1, kind: Pod, name: spec.podName, " +
		"uid: spec.podUID} with controller and blockOwnerDeletion unset or false"
	msgSessionPodNamespace = "a session created with a pod-bound token lives in its pod's namespace (the service account's): " +
		"its Pod ownerReference cannot point into another namespace"
	msgSessionNoPod        = "a session created without a pod-bound token has no spec.podName, spec.podUID or metadata.ownerReferences"
	msgSessionFinalizers   = "a session is created without finalizers"
	msgSessionMeta         = "a session has at most 16 labels and at most 16 annotations"
	msgSessionMetaFixed    = "a session's ownerReferences and finalizers do not change (only the garbage collector removes them)"
	msgSessionPodOnly      = "a session bound to a pod (spec.podUID) is renewed, changed or closed by its user only from that same pod"
	msgSessionControllerSt = "the controller changes only a session's status.locks"
	msgSessionLocks        = "status.locks of a session is the controller's count"
	msgSessionRenewTime    = "status.renewTime of a session is never removed and never moves backwards"
	msgSessionRenew        = "a holding in a session is renewed through its session"
)

// msgSessionAnnotationBytes: the controller caches every session
// (MaxCreateAnnotationBytes); config/policy's session policy says the same.
const msgSessionAnnotationBytes = "a session's annotations take at most 4096 bytes, keys and values together"

// maxSessionMeta bounds a session's labels and annotations, as a created lock's (maxCreateMeta).
const maxSessionMeta = 16

var ownerRefsPath = metadataPath.Child("ownerReferences")

// owns reports whether a is s's owner: its user and, for a pod-bound session, its pod.
func (a Actor) owns(s *locksv1alpha1.LockSession) (user, pod bool) {
	return a.Username == s.Spec.User, samePod(s.Spec.PodUID, a)
}

// ValidateSessionCreate checks creating s by a.
func ValidateSessionCreate(s *locksv1alpha1.LockSession, a Actor) field.ErrorList {
	var errs field.ErrorList
	if s.Spec.User != a.Username {
		errs = append(errs, deny(specPath.Child("user"), RuleSession, "spec.user must be the requesting user %q, not %q", a.Username, s.Spec.User))
	}
	podName, podUID := a.pod()
	if podUID != "" {
		if s.Spec.PodName != podName || s.Spec.PodUID != podUID || !podOwner(s.OwnerReferences, podName, podUID) {
			errs = append(errs, deny(specPath, RuleSession, msgSessionPod))
		}
		if ns, ok := serviceAccountNamespace(a.Username); ok && ns != s.Namespace {
			errs = append(errs, deny(metadataPath.Child("namespace"), RuleSession, msgSessionPodNamespace))
		}
	} else if s.Spec.PodName != "" || s.Spec.PodUID != "" || len(s.OwnerReferences) > 0 {
		errs = append(errs, deny(specPath, RuleSession, msgSessionNoPod))
	}
	errs = append(errs, validatePodForm(specPath, "spec", s.Spec.PodName, s.Spec.PodUID)...)
	if len(s.Finalizers) > 0 {
		errs = append(errs, deny(finalizersPath, RuleSession, msgSessionFinalizers))
	}
	return append(errs, validateSessionMeta(s)...)
}

// serviceAccountNamespace is the namespace of a service account's user name
// (system:serviceaccount:<namespace>:<name>), the namespace of its pods.
func serviceAccountNamespace(user string) (string, bool) {
	parts := strings.Split(user, ":")
	if len(parts) != 4 || parts[0] != "system" || parts[1] != "serviceaccount" {
		return "", false
	}
	return parts[2], true
}

// podOwner: refs is exactly the pod's ownerReference. It neither blocks the
// pod's deletion (a lock user has no update on pods/finalizers) nor claims to
// be the session's controller.
func podOwner(refs []metav1.OwnerReference, name, uid string) bool {
	if len(refs) != 1 {
		return false
	}
	r := refs[0]
	return r.APIVersion == "v1" && r.Kind == "Pod" && r.Name == name && string(r.UID) == uid &&
		(r.Controller == nil || !*r.Controller) && (r.BlockOwnerDeletion == nil || !*r.BlockOwnerDeletion)
}

func validateSessionMeta(s *locksv1alpha1.LockSession) field.ErrorList {
	if len(s.Labels) > maxSessionMeta || len(s.Annotations) > maxSessionMeta {
		return field.ErrorList{deny(metadataPath, RuleSession, msgSessionMeta)}
	}
	if n, _ := annotationBytes(s.Annotations); n > MaxCreateAnnotationBytes {
		return field.ErrorList{deny(metadataPath.Child("annotations"), RuleSession, msgSessionAnnotationBytes)}
	}
	return nil
}

// ValidateSessionUpdate checks an UPDATE of a session's main resource (its
// spec is immutable in the CRD): only its owner, or the garbage collector,
// which alone may change ownerReferences and finalizers.
func ValidateSessionUpdate(oldObj, newObj *locksv1alpha1.LockSession, a Actor) field.ErrorList {
	if a.IsGarbageCollector {
		return nil
	}
	var errs field.ErrorList
	errs = append(errs, validateSessionOwner(oldObj, a)...)
	if !equality.Semantic.DeepEqual(oldObj.OwnerReferences, newObj.OwnerReferences) || !slices.Equal(oldObj.Finalizers, newObj.Finalizers) {
		errs = append(errs, deny(ownerRefsPath, RuleSession, msgSessionMetaFixed))
	}
	return append(errs, validateSessionMeta(newObj)...)
}

func validateSessionOwner(s *locksv1alpha1.LockSession, a Actor) field.ErrorList {
	user, pod := a.owns(s)
	switch {
	case !user:
		return field.ErrorList{deny(specPath.Child("user"), RuleSession, "only the session's user %q may renew or change session %s; %q is not its user", s.Spec.User, s.Name, a.Username)}
	case !pod:
		return field.ErrorList{deny(specPath.Child("podUID"), RuleSession, msgSessionPodOnly)}
	}
	return nil
}

// ValidateSessionStatus checks a write of a session's status: its owner
// renews (renewTime only, never backwards), the controller counts (locks only).
func ValidateSessionStatus(oldObj, newObj *locksv1alpha1.LockSession, a Actor) field.ErrorList {
	o, n := oldObj.Status, newObj.Status
	if a.IsController {
		n.Locks = o.Locks
		if !equality.Semantic.DeepEqual(o, n) {
			return field.ErrorList{deny(statusPath, RuleSession, msgSessionControllerSt)}
		}
		return nil
	}
	errs := validateSessionOwner(oldObj, a)
	if n.Locks != o.Locks {
		errs = append(errs, deny(statusPath.Child("locks"), RuleSession, msgSessionLocks))
	}
	if o.RenewTime != nil && (n.RenewTime == nil || n.RenewTime.Before(o.RenewTime)) {
		errs = append(errs, deny(statusPath.Child("renewTime"), RuleSession, msgSessionRenewTime))
	}
	return errs
}

// ValidateSessionDelete checks closing s: its owner (from its pod, as for a
// pod-bound holding's release), the controller (a lapsed session), the
// garbage collector (its pod is gone) or a user with force-release on
// locksessions.
func ValidateSessionDelete(s *locksv1alpha1.LockSession, a Actor) field.ErrorList {
	if user, pod := a.owns(s); (user && pod) || a.IsController || a.IsGarbageCollector {
		return nil
	}
	switch canForce, err := a.may(forceRelease(locksv1alpha1.LockSessionsResource, s.Namespace, s.Name), specPath.Child("user")); {
	case err != nil:
		return field.ErrorList{err}
	case canForce:
		return nil
	}
	return field.ErrorList{deny(specPath.Child("user"), RuleSession,
		"user %q may not close session %s of %q: only its user (from its pod), the controller, the garbage collector or a user with the %q verb on locksessions.locks.kubelock.io in namespace %s may",
		a.Username, s.Name, s.Spec.User, locksv1alpha1.ForceReleaseVerb, s.Namespace)}
}

// sessionRef is a holding or waiter of a lock write that names a session.
type sessionRef struct {
	path    *field.Path
	session string
	podUID  string
	holds   bool
}

// newSessionRefs are the session references a lock write adds: the new
// holding of an acquisition (exclusive or shared) and the added waiter. A
// write that acquires more than one holding or adds more than one waiter
// names none: the slot and queue rules refuse it, and each session it named
// would cost a live read (a write could name 1,024; red team).
func newSessionRefs(oldObj, newObj *locksv1alpha1.DistributedLock) []sessionRef {
	o, n := &oldObj.Status, &newObj.Status
	acquired, added := diffHoldings(o, n).acquired, addedWaiters(o, n)
	if len(acquired) > 1 || len(added) > 1 {
		return nil
	}
	var refs []sessionRef
	for _, acq := range acquired {
		if acq.h.Session != "" {
			refs = append(refs, sessionRef{acq.path.Child("session"), acq.h.Session, acq.h.PodUID, true})
		}
	}
	for _, i := range added {
		if w := n.Waiters[i]; w.Session != "" {
			refs = append(refs, sessionRef{waitersPath.Index(i).Child("session"), w.Session, w.PodUID, false})
		}
	}
	return refs
}

// SessionsNamed lists the sessions a lock write newly names, which
// ValidateSessionRefs needs to see.
func SessionsNamed(oldObj, newObj *locksv1alpha1.DistributedLock) []string {
	var names []string
	for _, r := range newSessionRefs(oldObj, newObj) {
		if !slices.Contains(names, r.session) {
			names = append(names, r.session)
		}
	}
	return names
}

// ValidateSessionRefs checks the session fields of a lock's status write by
// a: a holding in a session is not renewed itself, and a new holding or
// waiter names a live session of the writer bound to the same pod (or to none).
// sessions holds the sessions SessionsNamed lists, as read from the
// apiserver; a missing entry is a session that does not exist.
func ValidateSessionRefs(oldObj, newObj *locksv1alpha1.DistributedLock, a Actor, sessions map[string]*locksv1alpha1.LockSession) field.ErrorList {
	var errs field.ErrorList
	o, n := oldObj.Status.Holder, newObj.Status.Holder
	if o != nil && n != nil && renewedInSession(o, n) {
		errs = append(errs, deny(holderPath.Child("renewTime"), RuleSession, msgSessionRenew))
	}
	for _, k := range diffHoldings(&oldObj.Status, &newObj.Status).kept {
		if renewedInSession(&k.old.LockHolder, &k.new.LockHolder) {
			errs = append(errs, deny(k.path.Child("renewTime"), RuleSession, msgSessionRenew))
		}
	}
	// The podUID of each reference is the writer's token's (pod-binding).
	for _, r := range newSessionRefs(oldObj, newObj) {
		maxLease := int32(0)
		if r.holds {
			maxLease = newObj.MaxLease()
		}
		if why := locksv1alpha1.SessionRefusal(oldObj.Namespace, r.session, sessions[r.session], a.Username, r.podUID, maxLease); why != "" {
			errs = append(errs, deny(r.path, RuleSession, "%s", why))
		}
	}
	return errs
}

// renewedInSession: the same holding, in a session, with its renewTime changed.
func renewedInSession(o, n *locksv1alpha1.LockHolder) bool {
	return o.Session != "" && o.LeaseID == n.LeaseID && !equality.Semantic.DeepEqual(o.RenewTime, n.RenewTime)
}
