package rules

import (
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/internal/escape"
)

// Operation is what a write of a fenced object does, as admission names it.
type Operation string

// The operations a fenced object's rules tell apart.
const (
	Create Operation = "CREATE"
	Update Operation = "UPDATE"
	Delete Operation = "DELETE"
)

var (
	fencedByPath = metadataPath.Child("annotations").Key(locksv1alpha1.FencedByAnnotation)
	fenceTokPath = metadataPath.Child("annotations").Key(locksv1alpha1.FencingTokenAnnotation)
)

// FencedLock is what the fenced-object rules need of the guarding lock:
// whether it exists, status.fencingToken (the latest token it issued), and
// the current holding's user and pod UID ("" when free).
type FencedLock struct {
	Exists                   bool
	Token                    int64
	HolderUser, HolderPodUID string
}

// GuardingLock is the name of the lock that guards a write of a fenced
// object: the old object's (oldFence), else the new one's fenced-by
// annotation ("" when neither is fenced). oldObj is nil for CREATE, newObj
// for DELETE.
func GuardingLock(oldObj, newObj metav1.Object) string {
	if l := oldFence(oldObj); l != "" {
		return l
	}
	if newObj != nil {
		return newObj.GetAnnotations()[locksv1alpha1.FencedByAnnotation]
	}
	return ""
}

// oldFence is the lock a stored object was fenced by: its fenced-by
// annotation while it carries the fenced label, "" otherwise. An object
// without the label is never sent to the fenced-objects webhook, so its
// annotations were never checked: anyone who may write it could have planted
// a fenced-by and a token there, and they must not judge the write that
// fences it (a token "already accepted", a "move" from another lock; red team).
func oldFence(oldObj metav1.Object) string {
	if oldObj == nil || oldObj.GetLabels()[locksv1alpha1.FencedLabel] != "true" {
		return ""
	}
	return oldObj.GetAnnotations()[locksv1alpha1.FencedByAnnotation]
}

// ValidateFencedWrite checks one write (CREATE, UPDATE or DELETE) of an object
// that is, or becomes, fenced by a lock; oldObj is nil for CREATE, newObj for
// DELETE. The write must carry the lock's current token (a DELETE carries
// none, so the object's stored token must be the current one: the holder
// stamps the object with an update, then deletes it), be at least the highest
// the object accepted, and come from the holder's user and pod, or from a
// user with the force-release verb on the lock (asked of a's Authorizer only
// when the writer is all that is wrong). A token carried over from someone
// else's write therefore authorises nobody. Messages never show the lock's
// current token.
func ValidateFencedWrite(op Operation, oldObj, newObj metav1.Object, lock FencedLock, a Actor) field.ErrorList {
	name := GuardingLock(oldObj, newObj)
	if name == "" {
		return nil
	}
	if errs := ValidateFencedBy(oldObj, newObj); len(errs) > 0 {
		return errs
	}
	token, err := fencedToken(op, oldObj, newObj, name)
	if err != nil {
		return field.ErrorList{err}
	}
	// The first failing check is the answer.
	for _, err := range []*field.Error{checkHighest(oldObj, name, token), checkCurrent(op, lock, name, token)} {
		if err != nil {
			return field.ErrorList{err}
		}
	}
	err = checkWriter(lock, name, a)
	if err == nil {
		return nil
	}
	switch canForce, failed := a.may(forceRelease(LocksResource, namespaceOf(oldObj, newObj), name), fenceTokPath); {
	case failed != nil:
		return field.ErrorList{failed}
	case canForce:
		return nil
	}
	return field.ErrorList{err}
}

// namespaceOf is the namespace of the write's object, that of its guarding lock.
func namespaceOf(oldObj, newObj metav1.Object) string {
	if oldObj != nil {
		return oldObj.GetNamespace()
	}
	return newObj.GetNamespace()
}

// ValidateFencedBy checks the fenced-by annotations of a write before
// anything reads the lock they name: each is a lock's name (a DNS-1123
// subdomain, as every object name), so that a string a user wrote reaches no
// URL path, log line or metric unless it can name a lock; and an object
// fenced by one lock does not move to another in one write.
func ValidateFencedBy(oldObj, newObj metav1.Object) field.ErrorList {
	names := [2]string{oldFence(oldObj)}
	if newObj != nil {
		names[1] = newObj.GetAnnotations()[locksv1alpha1.FencedByAnnotation]
	}
	for i := range names {
		if names[i] == "" {
			continue
		}
		if msgs := lockNameErrors(names[i]); len(msgs) > 0 {
			return field.ErrorList{deny(fencedByPath, RuleFencedBy, "annotation %s=%q does not name a lock (%d bytes): %s", locksv1alpha1.FencedByAnnotation, clip(names[i]), len(names[i]), strings.Join(msgs, "; "))}
		}
	}
	if o, n := names[0], names[1]; o != "" && n != "" && o != n {
		return field.ErrorList{deny(fencedByPath, RuleFencedBy, "the object is fenced by lock %q and cannot move to lock %q in one write: the holder of %q removes the %s annotation first, then the holder of %q fences it", o, n, o, locksv1alpha1.FencedByAnnotation, n)}
	}
	return nil
}

// lockNameErrors is what makes name no object's name; a name too long is
// refused on its length alone, so that no pattern runs over an annotation of
// hundreds of kB.
func lockNameErrors(name string) []string {
	if len(name) > validation.DNS1123SubdomainMaxLength {
		return []string{validation.MaxLenError(validation.DNS1123SubdomainMaxLength)}
	}
	return validation.IsDNS1123Subdomain(name)
}

// clipLen is how much of a string a user wrote a denial quotes: it names
// what it refused without echoing a whole annotation (up to 256 kB).
const clipLen = 64

func clip(s string) string { return escape.Clip(s, clipLen) }

// fencedToken reads the write's token: the new object's annotation, or for
// a DELETE the token stored on the object.
func fencedToken(op Operation, oldObj, newObj metav1.Object, lock string) (int64, *field.Error) {
	obj := newObj
	if op == Delete {
		obj = oldObj
	}
	raw, ok := obj.GetAnnotations()[locksv1alpha1.FencingTokenAnnotation]
	switch {
	case !ok && op == Delete:
		return 0, deny(fenceTokPath, RuleStaleToken, "the object is fenced by lock %q and stores no token: to delete it, the lock's holder first writes its token into the %s annotation, then deletes", lock, locksv1alpha1.FencingTokenAnnotation)
	case !ok:
		return 0, deny(fenceTokPath, RuleStaleToken, "the object is fenced by lock %q: every write (create, update, delete, also removing the fence) must carry the holder's fencing token in the %s annotation", lock, locksv1alpha1.FencingTokenAnnotation)
	}
	token, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || token <= 0 {
		return 0, deny(fenceTokPath, RuleStaleToken, "annotation %s=%q is not a positive integer", locksv1alpha1.FencingTokenAnnotation, clip(raw))
	}
	return token, nil
}

// checkHighest: the token is at least the highest the object accepted from
// this lock (stored on the old object).
func checkHighest(oldObj metav1.Object, lock string, token int64) *field.Error {
	if oldFence(oldObj) != lock {
		return nil
	}
	highest, err := strconv.ParseInt(oldObj.GetAnnotations()[locksv1alpha1.FencingTokenAnnotation], 10, 64)
	if err == nil && token < highest {
		return deny(fenceTokPath, RuleStaleToken, "stale fencing token %d for lock %q: this object already accepted token %d", token, lock, highest)
	}
	return nil
}

// checkCurrent: the token is the lock's current one, without saying which
// that is (the writer may not be its holder).
func checkCurrent(op Operation, lock FencedLock, name string, token int64) *field.Error {
	switch {
	case !lock.Exists:
		return deny(fenceTokPath, RuleStaleToken, "the object is fenced by lock %q, which does not exist: no token is current", name)
	case token > lock.Token:
		return deny(fenceTokPath, RuleStaleToken, "fencing token %d was never issued by lock %q", token, name)
	case token < lock.Token && op == Delete:
		return deny(fenceTokPath, RuleStaleToken, "the object's stored token %d is not the current token of lock %q: the current holder writes its token into the object first, then deletes it", token, name)
	case token < lock.Token:
		return deny(fenceTokPath, RuleStaleToken, "fencing token %d is not the current token of lock %q: a later holding of the lock began", token, name)
	}
	return nil
}

// checkWriter: the writer is the current holder's user (and pod).
func checkWriter(lock FencedLock, name string, a Actor) *field.Error {
	switch {
	case lock.HolderUser == "":
		return deny(fenceTokPath, RuleFencedWriter, "lock %q is not held: only its holder (or a user with the %s verb on it) writes the objects it fences", name, locksv1alpha1.ForceReleaseVerb)
	case lock.HolderUser != a.Username:
		return deny(fenceTokPath, RuleFencedWriter, "user %q does not hold lock %q: only the holder's user (or a user with the %s verb on the lock) writes the objects it fences; a token carried over from another writer authorises nobody", a.Username, name, locksv1alpha1.ForceReleaseVerb)
	case lock.HolderPodUID != "" && !samePod(lock.HolderPodUID, a):
		return deny(fenceTokPath, RuleFencedWriter, "lock %q is held from another pod of user %q: only the holding pod writes the objects it fences", name, a.Username)
	}
	return nil
}
