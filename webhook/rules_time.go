package webhook

import (
	"encoding/json"
	"regexp"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

var (
	microTimeRE = regexp.MustCompile(locksv1alpha1.MicroTimePattern)
	timeRE      = regexp.MustCompile(locksv1alpha1.TimePattern)
)

// rawStatus holds the time strings of a status as written, before Go's types
// parse them: a string they cannot parse must give a time-format denial, not a
// decode error.
type rawStatus struct {
	Status struct {
		Holder *struct {
			AcquireTime json.RawMessage `json:"acquireTime"`
			RenewTime   json.RawMessage `json:"renewTime"`
		} `json:"holder"`
		Waiters []struct {
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
