package rules

import (
	"encoding/json"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// Fixed messages of the bookkeeping and time-format rules, so that the
// ValidatingAdmissionPolicy can give the very same ones (see config/policy).
const (
	msgHolderCount        = "status.holderCount must equal the number of holdings, exclusive and shared"
	msgTransitions        = "status.transitions must grow by exactly one on each acquisition and stay unchanged otherwise"
	msgObservedGeneration = "a lock user may leave status.observedGeneration unchanged or set it to metadata.generation, nothing else"
	msgConditions         = "a lock user may leave status.conditions unchanged or set them to exactly one Held condition: status True if the lock has any holding (holder or shared holders) and False if not, observedGeneration equal to metadata.generation, reason Acquired, Released, Expired, ForceReleased or NeverHeld, a printable message of at most 256 characters"
	msgConditionsInStep   = "a write that acquires or ends a holding must set status.conditions to exactly one Held condition in step with it (True while any holding remains, False when none does)"
	msgTime               = "every status.conditions[].lastTransitionTime must be an RFC 3339 time that Go parses, such as 2026-01-02T15:04:05Z"
	msgMicroTime          = "every MicroTime in status must be an RFC 3339 time with exactly 6 fractional digits, such as 2026-01-02T15:04:05.000000Z"
	msgManagedFields      = "a lock user's write may not leave more than 16 server-side apply entries in metadata.managedFields when it adds one: each apply under another fieldManager adds one, and they could grow the lock until no acquisition fits in etcd any more"
)

// MaxManagedFields bounds the server-side apply entries of
// metadata.managedFields a lock user's write may leave when it adds one. The
// apiserver keeps at most 10 entries of update operations (merging older
// ones), but one per apply field manager without bound; each costs up to the
// size of the status, so a lock user could grow a lock until no acquisition
// or new waiter fits in etcd any more (releases and expiries shrink it).
// Update entries are not counted: a lock user who filled the bound must not
// keep a new client (a new field manager) from its first update.
const MaxManagedFields = 16

// applyEntries counts l's managedFields entries of server-side applies.
func applyEntries(l *locksv1alpha1.DistributedLock) int {
	n := 0
	for _, m := range l.ManagedFields {
		if m.Operation == metav1.ManagedFieldsOperationApply {
			n++
		}
	}
	return n
}

var heldReasons = map[string]bool{
	locksv1alpha1.ReasonAcquired: true, locksv1alpha1.ReasonReleased: true, locksv1alpha1.ReasonExpired: true,
	locksv1alpha1.ReasonForceReleased: true, locksv1alpha1.ReasonNeverHeld: true,
}

// validateBookkeeping keeps every writer's counts true (holderCount, and
// transitions, by which a client tells whether its lost acquire could still
// be in recentAcquisitions) and every time in status one Go reads back; and
// lock users from forging observedGeneration and conditions (foreign
// conditions could fill the list so that nobody's next write fits) or piling
// up server-side apply entries in managedFields (MaxManagedFields).
func validateBookkeeping(oldObj, newObj *locksv1alpha1.DistributedLock, d holdings, a Actor) field.ErrorList {
	o, n := &oldObj.Status, &newObj.Status
	var errs field.ErrorList
	if n.HolderCount != holderCount(n) {
		errs = append(errs, deny(statusPath.Child("holderCount"), RuleBookkeeping, msgHolderCount))
	}
	if n.Transitions != o.Transitions+int64(len(d.acquired)) {
		errs = append(errs, deny(statusPath.Child("transitions"), RuleBookkeeping, msgTransitions))
	}
	if !a.IsController {
		errs = append(errs, validateUserBookkeeping(oldObj, newObj, d)...)
	}
	return append(errs, validateTimes(n)...)
}

// validateUserBookkeeping checks what a lock user, unlike the controller,
// may not write: managedFields beyond the bound, an observedGeneration other
// than the lock's, conditions other than the one Held condition in step.
func validateUserBookkeeping(oldObj, newObj *locksv1alpha1.DistributedLock, d holdings) field.ErrorList {
	var errs field.ErrorList
	o, n := &oldObj.Status, &newObj.Status
	if m := applyEntries(newObj); m > applyEntries(oldObj) && m > MaxManagedFields {
		errs = append(errs, deny(metadataPath.Child("managedFields"), RuleBookkeeping, msgManagedFields))
	}
	if n.ObservedGeneration != o.ObservedGeneration && n.ObservedGeneration != newObj.Generation {
		errs = append(errs, deny(statusPath.Child("observedGeneration"), RuleBookkeeping, msgObservedGeneration))
	}
	if heldInStep(newObj) {
		return errs
	}
	switch {
	case !equality.Semantic.DeepEqual(o.Conditions, n.Conditions):
		errs = append(errs, deny(conditionsPath, RuleBookkeeping, msgConditions))
	case len(d.acquired) > 0 || len(d.ended) > 0:
		errs = append(errs, deny(conditionsPath, RuleBookkeeping, msgConditionsInStep))
	}
	return errs
}

// holderCount is the number of holdings in s, exclusive and shared.
func holderCount(s *locksv1alpha1.DistributedLockStatus) int32 {
	n := int32(len(s.SharedHolders))
	if s.Holder != nil {
		n++
	}
	return n
}

// heldInStep reports whether conditions are exactly the one Held condition a
// lock user may write for this status.
func heldInStep(l *locksv1alpha1.DistributedLock) bool {
	if len(l.Status.Conditions) != 1 {
		return false
	}
	c := l.Status.Conditions[0]
	want := metav1.ConditionFalse
	if l.IsHeld() {
		want = metav1.ConditionTrue
	}
	return c.Type == locksv1alpha1.ConditionHeld && c.Status == want && c.ObservedGeneration == l.Generation &&
		heldReasons[c.Reason] && utf8.RuneCountInString(c.Message) <= locksv1alpha1.MaxConditionMessage &&
		printable(c.Message)
}

// printable reports whether s has no control or format characters (terminal
// escapes, bidi overrides) and no line or paragraph separators (a new line
// to some viewers), as the CRD's identity pattern demands of names.
func printable(s string) bool {
	return !strings.ContainsFunc(s, func(r rune) bool { return unicode.In(r, unicode.Cc, unicode.Cf, unicode.Zl, unicode.Zp) })
}

// validateTimes checks every decoded time in status as Go will write it back
// (in UTC): it must match the CRD's pattern, or every later write of the lock
// by a Go client fails. A year-0 time with a positive offset parses but
// marshals as year -1.
func validateTimes(s *locksv1alpha1.DistributedLockStatus) field.ErrorList {
	b, err := json.Marshal(map[string]any{"status": s})
	if err != nil {
		return field.ErrorList{field.InternalError(statusPath, err)}
	}
	return ValidateRawStatusTimes(b)
}

var (
	microTimeRE = regexp.MustCompile(locksv1alpha1.MicroTimePattern)
	timeRE      = regexp.MustCompile(locksv1alpha1.TimePattern)
)

// rawStatus holds the time strings of a status as written, before Go's types
// parse them: a string they cannot parse must give a time-format denial, not a
// decode error.
type rawStatus struct {
	Status struct {
		Holder        *rawHolding  `json:"holder"`
		SharedHolders []rawHolding `json:"sharedHolders"`
		Waiters       []struct {
			EnqueueTime json.RawMessage `json:"enqueueTime"`
			Deadline    json.RawMessage `json:"deadline"`
		} `json:"waiters"`
		RecentAcquisitions []struct {
			EndTime json.RawMessage `json:"endTime"`
		} `json:"recentAcquisitions"`
		Conditions []struct {
			LastTransitionTime json.RawMessage `json:"lastTransitionTime"`
		} `json:"conditions"`
	} `json:"status"`
}

type rawHolding struct {
	AcquireTime json.RawMessage `json:"acquireTime"`
	RenewTime   json.RawMessage `json:"renewTime"`
}

// ValidateRawStatusTimes checks every time string of a lock's JSON: each must
// be one Go's metav1 types parse and marshal back to a parseable string. JSON
// that does not have the lock's shape is left to the decoder.
func ValidateRawStatusTimes(raw []byte) field.ErrorList {
	var r rawStatus
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil
	}
	var errs field.ErrorList
	check := func(p *field.Path, v json.RawMessage, micro bool) {
		if len(v) == 0 || string(v) == "null" {
			return
		}
		var s string
		ok := json.Unmarshal(v, &s) == nil
		switch {
		case micro && !(ok && ValidMicroTime(s)):
			errs = append(errs, deny(p, RuleTimeFormat, msgMicroTime))
		case !micro && !(ok && ValidTime(s)):
			errs = append(errs, deny(p, RuleTimeFormat, msgTime))
		}
	}
	s := &r.Status
	if h := s.Holder; h != nil {
		check(holderPath.Child("acquireTime"), h.AcquireTime, true)
		check(holderPath.Child("renewTime"), h.RenewTime, true)
	}
	for i, h := range s.SharedHolders {
		check(sharedPath.Index(i).Child("acquireTime"), h.AcquireTime, true)
		check(sharedPath.Index(i).Child("renewTime"), h.RenewTime, true)
	}
	for i, w := range s.Waiters {
		check(waitersPath.Index(i).Child("enqueueTime"), w.EnqueueTime, true)
		check(waitersPath.Index(i).Child("deadline"), w.Deadline, true)
	}
	for i, a := range s.RecentAcquisitions {
		check(recentPath.Index(i).Child("endTime"), a.EndTime, true)
	}
	for i, c := range s.Conditions {
		check(conditionsPath.Index(i).Child("lastTransitionTime"), c.LastTransitionTime, false)
	}
	return errs
}

// ValidMicroTime reports whether s is a metav1.MicroTime as the CRD pattern
// describes it, that Go parses and marshals back to a string Go parses again.
func ValidMicroTime(s string) bool { return validTime(s, microTimeRE, &metav1.MicroTime{}) }

// ValidTime is ValidMicroTime for metav1.Time (RFC 3339, optional fraction).
func ValidTime(s string) bool { return validTime(s, timeRE, &metav1.Time{}) }

func validTime(s string, re *regexp.Regexp, t interface {
	json.Marshaler
	json.Unmarshaler
}) bool {
	q, _ := json.Marshal(s)
	if !re.MatchString(s) || t.UnmarshalJSON(q) != nil {
		return false
	}
	b, err := t.MarshalJSON()
	return err == nil && t.UnmarshalJSON(b) == nil
}
