package rules

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// specDefault is a spec field's default in the CRD (api/v1alpha1 markers), as JSON.
type specDefault struct {
	field string
	value string
}

// specDefaults lists every spec field that has a CRD default, with it, in the
// order denials name them; config/policy's metadata policy has the same list,
// and TestSpecDefaultsMatchCRD holds it to the CRD. A field without a default
// (spec.permits) is not default whenever it is set.
var specDefaults = []specDefault{
	{"type", `"` + string(locksv1alpha1.Mutex) + `"`},
	{"leaseDurationSeconds", fmt.Sprint(locksv1alpha1.DefaultLeaseDurationSeconds)},
	{"maxLeaseDurationSeconds", fmt.Sprint(locksv1alpha1.DefaultMaxLeaseDurationSeconds)},
	{"maxWaiters", fmt.Sprint(locksv1alpha1.DefaultMaxWaiters)},
	{"handoffTimeoutSeconds", fmt.Sprint(locksv1alpha1.DefaultHandoffTimeoutSeconds)},
	{"maxWaitersPerUser", fmt.Sprint(locksv1alpha1.DefaultMaxWaitersPerUser)},
	{"maxWaitSeconds", fmt.Sprint(locksv1alpha1.DefaultMaxWaitSeconds)},
}

var (
	forceDeletePath = metadataPath.Child("annotations").Key(locksv1alpha1.ForceDeleteAnnotation)
	autoCreatedPath = metadataPath.Child("labels").Key(locksv1alpha1.AutoCreatedLabel)
)

// msgAutoCreatedAdded is the denial of an UPDATE that adds the auto-created
// label; config/policy's metadata policy gives the same words.
const msgAutoCreatedAdded = "the " + locksv1alpha1.AutoCreatedLabel + " label marks a client's create on first use: no update adds it to a lock"

// MetadataChanged reports whether an UPDATE of the main resource touches what
// the main-resource rules guard (finalizers, the force-delete annotation, the
// auto-created label). Every other edit (spec, other labels and annotations)
// is admitted unchecked. The webhook's matchConditions and the policy's say
// the same in CEL.
func MetadataChanged(oldObj, newObj *locksv1alpha1.DistributedLock) bool {
	return !slices.Equal(oldObj.Finalizers, newObj.Finalizers) ||
		!sameEntry(oldObj.Annotations, newObj.Annotations, locksv1alpha1.ForceDeleteAnnotation) ||
		!sameEntry(oldObj.Labels, newObj.Labels, locksv1alpha1.AutoCreatedLabel)
}

// sameEntry reports whether key is absent from both maps or has one value in both.
func sameEntry(o, n map[string]string, key string) bool {
	ov, had := o[key]
	nv, has := n[key]
	return had == has && ov == nv
}

// ValidateCreate checks creating lock by a. A lock user creates a lock with
// the default spec and little metadata (what pkg/lock creates on first use);
// anything else needs the update verb, the force-delete annotation the
// force-release verb. a's Authorizer is asked only about what the lock sets.
func ValidateCreate(lock *locksv1alpha1.DistributedLock, a Actor) field.ErrorList {
	force, annotated := lock.Annotations[locksv1alpha1.ForceDeleteAnnotation]
	canForce, err := a.mayIf(annotated, forceRelease(LocksResource, lock.Namespace, lock.Name), forceDeletePath)
	if err != nil {
		return field.ErrorList{err}
	}
	bad := nonDefault(lock)
	canUpdate, err := a.mayIf(len(bad) > 0, Check{Verb: UpdateVerb, Resource: LocksResource, Namespace: lock.Namespace, Name: lock.Name}, specPath)
	if err != nil {
		return field.ErrorList{err}
	}
	var errs field.ErrorList
	if annotated && !canForce {
		errs = append(errs, forceDeleteDenial(lock.Namespace, force, a))
	}
	if len(bad) > 0 && !canUpdate {
		errs = append(errs, deny(specPath, RuleCreate, "user %q may create a lock only with the default spec, no finalizers and no %s annotation (anything else needs the %q verb on distributedlocks.locks.kubelock.io in namespace %s); lock %s sets %s",
			a.Username, locksv1alpha1.ForceDeleteAnnotation, UpdateVerb, lock.Namespace, lock.Name, strings.Join(bad, ", ")))
	}
	// The controller deletes an idle lock that carries the auto-created
	// label: only a client's create on first use, with the default spec,
	// carries it, whoever creates the lock.
	if spec := nonDefaultSpec(lock); labelledAutoCreated(lock) && len(spec) > 0 {
		errs = append(errs, deny(autoCreatedPath, RuleCreate, "lock %s carries the %s label with %s: the label marks a client's create on first use, with the default spec; declare the lock without it",
			lock.Name, locksv1alpha1.AutoCreatedLabel, strings.Join(spec, ", ")))
	}
	return errs
}

func labelledAutoCreated(lock *locksv1alpha1.DistributedLock) bool {
	return lock.Labels[locksv1alpha1.AutoCreatedLabel] == "true"
}

// ValidateMetadataUpdate checks an UPDATE of the main resource, oldObj →
// newObj, by a: setting the force-delete annotation, or removing a finalizer
// of a held lock (a delete), needs the force-release verb; no update adds the
// auto-created label.
func ValidateMetadataUpdate(oldObj, newObj *locksv1alpha1.DistributedLock, a Actor) field.ErrorList {
	forcing, finalizing := forceDeleteSet(oldObj, newObj), heldFinalizerRemoval(oldObj, newObj)
	canForce, err := a.mayIf(forcing || finalizing, forceRelease(LocksResource, oldObj.Namespace, oldObj.Name), metadataPath)
	if err != nil {
		return field.ErrorList{err}
	}
	var errs field.ErrorList
	if forcing && !canForce {
		errs = append(errs, forceDeleteDenial(newObj.Namespace, newObj.Annotations[locksv1alpha1.ForceDeleteAnnotation], a))
	}
	if finalizing && !canForce {
		h := firstHolding(oldObj)
		errs = append(errs, deny(finalizersPath, RuleHeldDelete, "lock %s is held by %s (lease %s); removing its finalizers %s is a delete: release it first, or annotate it %s=true, or use an account with the %q verb",
			oldObj.Name, h.User, h.LeaseID, strings.Join(removedFinalizers(oldObj, newObj), ", "), locksv1alpha1.ForceDeleteAnnotation, locksv1alpha1.ForceReleaseVerb))
	}
	// An administrator who writes a lock owns it from then on; the
	// controller keeps it whatever its labels.
	if labelledAutoCreated(newObj) && !labelledAutoCreated(oldObj) {
		errs = append(errs, deny(autoCreatedPath, RuleCreate, msgAutoCreatedAdded))
	}
	return errs
}

// ValidateDelete checks deleting lock: a held lock goes only with the
// force-delete annotation or the force-release verb, so no holder's state is
// silently lost.
func ValidateDelete(lock *locksv1alpha1.DistributedLock, a Actor) field.ErrorList {
	h := firstHolding(lock)
	if h == nil || lock.Annotations[locksv1alpha1.ForceDeleteAnnotation] == "true" {
		return nil
	}
	switch canForce, err := a.may(forceRelease(LocksResource, lock.Namespace, lock.Name), holderPath); {
	case err != nil:
		return field.ErrorList{err}
	case canForce:
		return nil
	}
	return field.ErrorList{deny(holderPath, RuleHeldDelete, "lock %s is held by %s (lease %s); release it first, or annotate it %s=true, or use an account with the %q verb", lock.Name, h.User, h.LeaseID, locksv1alpha1.ForceDeleteAnnotation, locksv1alpha1.ForceReleaseVerb)}
}

// firstHolding is the holding delete denials name: the exclusive holder, else
// the first shared holder; nil when the lock is free.
func firstHolding(lock *locksv1alpha1.DistributedLock) *locksv1alpha1.LockHolder {
	switch s := &lock.Status; {
	case s.Holder != nil:
		return s.Holder
	case len(s.SharedHolders) > 0:
		return &s.SharedHolders[0].LockHolder
	}
	return nil
}

func forceDeleteDenial(namespace, value string, a Actor) *field.Error {
	return deny(forceDeletePath, RuleForceDelete, "user %q may not set the %s annotation (to \"%s\"): it needs the %q verb on distributedlocks.locks.kubelock.io in namespace %s",
		a.Username, locksv1alpha1.ForceDeleteAnnotation, value, locksv1alpha1.ForceReleaseVerb, namespace)
}

// forceDeleteSet: the write adds the annotation or changes its value.
// Removing it only makes deleting harder, so it is not guarded.
func forceDeleteSet(oldObj, newObj *locksv1alpha1.DistributedLock) bool {
	n, ok := newObj.Annotations[locksv1alpha1.ForceDeleteAnnotation]
	if !ok {
		return false
	}
	o, had := oldObj.Annotations[locksv1alpha1.ForceDeleteAnnotation]
	return !had || o != n
}

// heldFinalizerRemoval: the write removes a finalizer of a held lock that is
// not already marked for forced deletion. The last finalizer's removal
// completes a pending delete, so it is a delete of the held lock.
func heldFinalizerRemoval(oldObj, newObj *locksv1alpha1.DistributedLock) bool {
	return oldObj.IsHeld() &&
		oldObj.Annotations[locksv1alpha1.ForceDeleteAnnotation] != "true" &&
		len(removedFinalizers(oldObj, newObj)) > 0
}

func removedFinalizers(oldObj, newObj *locksv1alpha1.DistributedLock) []string {
	var out []string
	for _, f := range oldObj.Finalizers {
		if !slices.Contains(newObj.Finalizers, f) {
			out = append(out, f)
		}
	}
	return out
}

// nonDefault lists what a lock user may not create: spec fields that differ
// from their defaults (nonDefaultSpec), finalizers, the force-delete
// annotation and bulk metadata.
func nonDefault(lock *locksv1alpha1.DistributedLock) []string {
	out := nonDefaultSpec(lock)
	if len(lock.Finalizers) > 0 {
		out = append(out, "metadata.finalizers")
	}
	if _, ok := lock.Annotations[locksv1alpha1.ForceDeleteAnnotation]; ok {
		out = append(out, "annotation "+locksv1alpha1.ForceDeleteAnnotation)
	}
	// Bulk metadata: a lock a lock user creates must stay small, or it could
	// be created just below etcd's request limit so that no later write,
	// not even its first acquisition, fits.
	if len(lock.OwnerReferences) > 0 {
		out = append(out, "metadata.ownerReferences")
	}
	for _, m := range []struct {
		what string
		n    int
	}{{"labels", len(lock.Labels)}, {"annotations", len(lock.Annotations)}, {"managedFields", len(lock.ManagedFields)}} {
		if limit := maxCreateMeta[m.what]; m.n > limit {
			out = append(out, fmt.Sprintf("metadata.%s (%d, at most %d)", m.what, m.n, limit))
		}
	}
	if n, ok := annotationBytes(lock.Annotations); ok && n > MaxCreateAnnotationBytes {
		out = append(out, fmt.Sprintf("metadata.annotations (%d bytes, at most %d)", n, MaxCreateAnnotationBytes))
	}
	return out
}

// annotationBytes is the size of annotations, keys and values, when there
// are at most as many as a lock user's create may carry; ok is false
// otherwise (their number already refuses the create, and the policy then
// counts no bytes: CEL's cost grows with every entry).
func annotationBytes(annotations map[string]string) (n int, ok bool) {
	if len(annotations) > maxCreateMeta["annotations"] {
		return 0, false
	}
	for k, v := range annotations {
		n += len(k) + len(v)
	}
	return n, true
}

// nonDefaultSpec lists the spec fields of lock that differ from their
// defaults, in specDefaults' order, then unknown fields sorted. The spec is
// compared as JSON, the form the policy sees, so a field this package does
// not know still counts.
func nonDefaultSpec(lock *locksv1alpha1.DistributedLock) []string {
	spec, err := specJSON(lock.Spec)
	if err != nil {
		// Unreadable is not default: only administrators pass.
		return []string{fmt.Sprintf("spec (unreadable: %v)", err)}
	}
	var out []string
	known := map[string]bool{}
	for _, d := range specDefaults {
		known[d.field] = true
		if v, ok := spec[d.field]; ok && string(v) != d.value {
			out = append(out, fmt.Sprintf("spec.%s=%s (default %s)", d.field, plain(v), plain([]byte(d.value))))
		}
	}
	var unknown []string
	for k, v := range spec {
		if !known[k] {
			unknown = append(unknown, fmt.Sprintf("spec.%s=%s", k, plain(v)))
		}
	}
	sort.Strings(unknown)
	return append(out, unknown...)
}

// maxCreateMeta bounds the metadata entries of a lock created by a lock user:
// pkg/lock writes one label and one annotation; the apiserver records one
// managedFields entry for the creator.
var maxCreateMeta = map[string]int{"labels": 16, "annotations": 16, "managedFields": 1}

// MaxCreateAnnotationBytes bounds the bytes of the annotations (keys and
// values) of a lock a lock user creates and of every session. The apiserver
// takes 256 kB of annotations per object, and the controller caches every
// lock and session it watches: 250 kB per object of a lock user's quota
// would be an operator's memory. A client writes one annotation, a key of
// at most 1,024 bytes.
const MaxCreateAnnotationBytes = 4096

// specJSON is spec as the apiserver stores it: field name → JSON value.
func specJSON(spec locksv1alpha1.DistributedLockSpec) (map[string]json.RawMessage, error) {
	var out map[string]json.RawMessage
	b, err := json.Marshal(spec)
	if err == nil {
		err = json.Unmarshal(b, &out)
	}
	return out, err
}

// plain is a JSON value as the policy's string() prints it: a string
// without its quotes, anything else as written.
func plain(v json.RawMessage) string {
	var s string
	if json.Unmarshal(v, &s) == nil {
		return s
	}
	return string(v)
}
