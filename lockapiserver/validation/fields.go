// Package validation is the DistributedLock and LockSession CRDs' own checks
// (their OpenAPI schemas and x-kubernetes-validations rules, generated from
// the api/v1alpha1 markers) and their defaults, written in Go for the typed
// objects of the lock apiserver: what the CRD backend's apiserver checks and
// fills in before admission, without a schema walk or CEL. Who may change
// what is not here: that is admission's (package webhook's rules).
//
// TestInvariantsAgreeWithTheCRD and TestDefaultsMatchTheCRD hold the two to
// the generated CRDs.
package validation

import (
	"encoding/json"
	"fmt"
	"regexp"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// The schema's patterns. The markers cannot name constants, so the ones
// api/v1alpha1 does not export are spelled here as in the markers.
var (
	identityRE   = regexp.MustCompile(locksv1alpha1.IdentityPattern)
	podNameRE    = regexp.MustCompile(locksv1alpha1.PodNamePattern)
	podUIDRE     = regexp.MustCompile(locksv1alpha1.PodUIDPattern)
	microTimeRE  = regexp.MustCompile(locksv1alpha1.MicroTimePattern)
	leaseIDRE    = regexp.MustCompile(`^[0-9a-zA-Z-]+$`)
	requestIDRE  = regexp.MustCompile(`^[0-9a-zA-Z._-]+$`)
	sessionRE    = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	condTypeRE   = regexp.MustCompile(`^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$`)
	condReasonRE = regexp.MustCompile(`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`)
)

// errs collects one object's errors; its methods are the schema's keywords.
// Each error reads as the CRD's apiserver words it (the OpenAPI validator's
// "<path> in body should ...", a CEL rule's message without a value), so a
// client sees the same refusal from either backend.
type errs struct{ list field.ErrorList }

// schema is a failed schema keyword: the OpenAPI validator names the field
// again in its detail.
func (e *errs) schema(p *field.Path, v any, detail string) {
	e.list = append(e.list, field.Invalid(p, v, p.String()+" in body "+detail))
}

// between: minimum and maximum.
func (e *errs) between(p *field.Path, v, lo, hi int64) {
	switch {
	case v < lo:
		e.schema(p, v, fmt.Sprintf("should be greater than or equal to %d", lo))
	case v > hi:
		e.schema(p, v, fmt.Sprintf("should be less than or equal to %d", hi))
	}
}

// atLeast: a minimum alone.
func (e *errs) atLeast(p *field.Path, v, lo int64) {
	if v < lo {
		e.schema(p, v, fmt.Sprintf("should be greater than or equal to %d", lo))
	}
}

// text: minLength, maxLength (in characters, as OpenAPI counts) and a
// pattern (nil: none). The empty string of an optional field (min 0) is
// absent: the CRD never sees it, omitempty drops it.
func (e *errs) text(p *field.Path, v string, lo, hi int, re *regexp.Regexp) {
	n := utf8.RuneCountInString(v)
	switch {
	case v == "" && lo == 0:
	case n < lo:
		e.schema(p, v, fmt.Sprintf("should be at least %d chars long", lo))
	case n > hi:
		e.list = append(e.list, field.TooLong(p, "", hi))
	case re != nil && !re.MatchString(v):
		e.schema(p, v, "should match '"+re.String()+"'")
	}
}

// oneOf: an enum.
func (e *errs) oneOf(p *field.Path, v string, allowed ...string) {
	for _, a := range allowed {
		if v == a {
			return
		}
	}
	e.list = append(e.list, field.NotSupported(p, v, allowed))
}

// microTime: the form Go writes t in must match the CRD's pattern; a zero
// time is written as null, which a required field does not take.
func (e *errs) microTime(p *field.Path, t metav1.MicroTime, required bool) {
	if t.IsZero() {
		if required {
			e.null(p)
		}
		return
	}
	b, err := t.MarshalJSON()
	var s string
	if err == nil {
		err = json.Unmarshal(b, &s)
	}
	if err != nil || !microTimeRE.MatchString(s) {
		e.schema(p, s, "should match '"+locksv1alpha1.MicroTimePattern+"'")
	}
}

// null: a required string that Go writes as null (a zero time).
func (e *errs) null(p *field.Path) {
	e.schema(p, "null", `must be of type string: "null"`)
}

// maxItems: a list's bound.
func (e *errs) maxItems(p *field.Path, n, hi int) {
	if n > hi {
		e.list = append(e.list, field.TooMany(p, n, hi))
	}
}

// rule: an x-kubernetes-validations rule of an object or a list that
// failed, with its message (the apiserver shows no value for it).
func (e *errs) rule(p *field.Path, ok bool, message string) {
	e.valueRule(p, ok, field.OmitValueType{}, message)
}

// valueRule: a rule of the scalar field at p, whose value v the apiserver
// shows.
func (e *errs) valueRule(p *field.Path, ok bool, v any, message string) {
	if !ok {
		e.list = append(e.list, field.Invalid(p, v, message))
	}
}
