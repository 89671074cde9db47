package webhook

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/internal/escape"
	"github.com/kubelock/kubelock/internal/metrics"
)

// FencedPath is where the webhook server serves the fenced-object validator.
const FencedPath = "/validate-fenced-object"

var (
	fencedByPath = field.NewPath("metadata", "annotations").Key(locksv1alpha1.FencedByAnnotation)
	fenceTokPath = field.NewPath("metadata", "annotations").Key(locksv1alpha1.FencingTokenAnnotation)
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
// without the label is never sent to this webhook, so its annotations were
// never checked: anyone who may write it could have planted a fenced-by and a
// token there, and they must not judge the write that fences it (a token
// "already accepted", a "move" from another lock; red team).
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
// user with force-release (a.CanForceRelease). A token carried over from
// someone else's write therefore authorises nobody. Messages never show the
// lock's current token. Pure.
func ValidateFencedWrite(op admissionv1.Operation, oldObj, newObj metav1.Object, lock FencedLock, a Actor) field.ErrorList {
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
	for _, err := range []*field.Error{checkHighest(oldObj, name, token), checkCurrent(op, lock, name, token), checkWriter(lock, name, a)} {
		if err != nil {
			return field.ErrorList{err}
		}
	}
	return nil
}

// ValidateFencedBy checks the fenced-by annotations of a write before
// anything reads the lock they name: each is a lock's name (a DNS-1123
// subdomain, as every object name), so that a string a user wrote reaches no
// URL path, log line or metric unless it can name a lock; and an object
// fenced by one lock does not move to another in one write. Pure.
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
func fencedToken(op admissionv1.Operation, oldObj, newObj metav1.Object, lock string) (int64, *field.Error) {
	obj := newObj
	if op == admissionv1.Delete {
		obj = oldObj
	}
	raw, ok := obj.GetAnnotations()[locksv1alpha1.FencingTokenAnnotation]
	switch {
	case !ok && op == admissionv1.Delete:
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
func checkCurrent(op admissionv1.Operation, lock FencedLock, name string, token int64) *field.Error {
	switch {
	case !lock.Exists:
		return deny(fenceTokPath, RuleStaleToken, "the object is fenced by lock %q, which does not exist: no token is current", name)
	case token > lock.Token:
		return deny(fenceTokPath, RuleStaleToken, "fencing token %d was never issued by lock %q", token, name)
	case token < lock.Token && op == admissionv1.Delete:
		return deny(fenceTokPath, RuleStaleToken, "the object's stored token %d is not the current token of lock %q: the current holder writes its token into the object first, then deletes it", token, name)
	case token < lock.Token:
		return deny(fenceTokPath, RuleStaleToken, "fencing token %d is not the current token of lock %q: a later holding of the lock began", token, name)
	}
	return nil
}

// checkWriter: the writer is the current holder's user (and pod), or may force-release.
func checkWriter(lock FencedLock, name string, a Actor) *field.Error {
	if a.CanForceRelease {
		return nil
	}
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

// onlyWriterErrors reports whether errs fail only because of the writer, so
// that the force-release verb would let the write pass.
func onlyWriterErrors(errs field.ErrorList) bool {
	for _, e := range errs {
		if ruleOf(e) != RuleFencedWriter {
			return false
		}
	}
	return len(errs) > 0
}

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
	name := GuardingLock(oldObj, newObj)
	if name == "" {
		return respond(nil)
	}
	errs, lock, err := v.validateFenced(ctx, req, oldObj, newObj, name)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
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
// against the lock (lock: what was read, nil if nothing was), asking for the
// force-release verb if only the writer is wrong.
func (v *Validator) validateFenced(ctx context.Context, req admission.Request, oldObj, newObj metav1.Object, name string) (errs field.ErrorList, lock *FencedLock, err error) {
	if errs := ValidateFencedBy(oldObj, newObj); len(errs) > 0 {
		return errs, nil, nil
	}
	l, err := v.readLock(ctx, req.Namespace, name)
	if err != nil {
		return nil, nil, err
	}
	a := Actor{Username: req.UserInfo.Username, Extra: extra(req.UserInfo.Extra)}
	errs = ValidateFencedWrite(req.Operation, oldObj, newObj, l, a)
	if onlyWriterErrors(errs) {
		if a.CanForceRelease, err = v.can(ctx, req.UserInfo, lockResource, req.Namespace, name, locksv1alpha1.ForceReleaseVerb); err != nil {
			return nil, nil, err
		}
		errs = ValidateFencedWrite(req.Operation, oldObj, newObj, l, a)
	}
	return errs, &l, nil
}

// countStaleToken counts a write denied for a stale token in the series of
// the guarding lock, if it was read and exists: a name no lock has gets no
// series, and a lock found gone loses its own.
func countStaleToken(namespace, name string, lock *FencedLock, errs field.ErrorList) {
	switch {
	case lock == nil:
	case !lock.Exists:
		metrics.Hot.Forget(namespace, name)
	case slices.ContainsFunc(errs, func(e *field.Error) bool { return ruleOf(e) == RuleStaleToken }):
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

func (v *Validator) readLock(ctx context.Context, ns, name string) (FencedLock, error) {
	l := &locksv1alpha1.DistributedLock{}
	switch err := v.reader.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, l); {
	case apierrors.IsNotFound(err):
		return FencedLock{}, nil
	case err != nil:
		return FencedLock{}, fmt.Errorf("webhook: reading lock %s/%s: %w", ns, name, err)
	}
	f := FencedLock{Exists: true, Token: l.Status.FencingToken}
	if h := l.Status.Holder; h != nil {
		f.HolderUser, f.HolderPodUID = h.User, h.PodUID
	}
	return f, nil
}
