package rules

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/kube-openapi/pkg/validation/strfmt"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// TestBookkeepingRules: the counts, conditions, times and managedFields
// every write keeps true. Each case is judged by the rules, by rule and
// message, and by the policy.
func TestBookkeepingRules(t *testing.T) {
	runRuleCases(t, []ruleCase{
		// transitions and holderCount
		{name: "acquire without counting the transition", old: free(), edit: func(l *locksv1alpha1.DistributedLock) {
			l.Acquire(holder(alice, "l1", "r1"), 101)
			l.Status.Transitions--
		}, actor: Actor{Username: alice}, rule: RuleBookkeeping},
		{name: "a renewal that counts a transition", old: heldBy(alice), edit: func(l *locksv1alpha1.DistributedLock) {
			renew(l)
			l.Status.Transitions++
		}, actor: Actor{Username: alice}, rule: RuleBookkeeping},
		{name: "the controller resetting transitions", old: released(), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.Transitions = 0 }, actor: Actor{Username: ctrlr, IsController: true}, rule: RuleBookkeeping},
		{name: "a reader not counted in holderCount", old: reading(typed(rw, 0), alice), edit: edits(share(bob, "l1", "r1", 1), func(l *locksv1alpha1.DistributedLock) { l.Status.HolderCount = 1 }),
			actor: Actor{Username: bob}, rule: RuleBookkeeping, msg: msgHolderCount},

		// observedGeneration and conditions
		{name: "observedGeneration set to generation", old: generation(free(), 4), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.ObservedGeneration = 4 }, actor: Actor{Username: alice}},
		{name: "observedGeneration forged", old: generation(free(), 4), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.ObservedGeneration = 99 }, actor: Actor{Username: alice}, rule: RuleBookkeeping, msg: msgObservedGeneration},
		{name: "controller sets any observedGeneration", old: generation(free(), 4), edit: func(l *locksv1alpha1.DistributedLock) { l.Status.ObservedGeneration = 3 }, actor: Actor{Username: ctrlr, IsController: true}},
		{name: "foreign condition", old: free(), edit: addCondition("Frozen", metav1.ConditionTrue, "Attack"), actor: Actor{Username: alice}, rule: RuleBookkeeping, msg: msgConditions},
		{name: "eight foreign conditions", old: free(), edit: func(l *locksv1alpha1.DistributedLock) {
			for i := range locksv1alpha1.MaxConditions {
				addCondition("C"+string(rune('a'+i)), metav1.ConditionTrue, "Attack")(l)
			}
		}, actor: Actor{Username: alice}, rule: RuleBookkeeping, msg: msgConditions},
		{name: "controller writes another condition", old: free(), edit: addCondition("Degraded", metav1.ConditionTrue, "Whatever"), actor: Actor{Username: ctrlr, IsController: true}},
		{name: "Held True without a holder", old: free(), edit: addCondition(locksv1alpha1.ConditionHeld, metav1.ConditionTrue, locksv1alpha1.ReasonAcquired), actor: Actor{Username: alice}, rule: RuleBookkeeping, msg: msgConditions},
		{name: "Held False NeverHeld on a free lock", old: free(), edit: addCondition(locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonNeverHeld), actor: Actor{Username: alice}},
		{name: "Held with an unknown reason", old: free(), edit: addCondition(locksv1alpha1.ConditionHeld, metav1.ConditionFalse, "Whatever"), actor: Actor{Username: alice}, rule: RuleBookkeeping, msg: msgConditions},
		{name: "Held with a long message", old: free(), edit: func(l *locksv1alpha1.DistributedLock) {
			addCondition(locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonNeverHeld)(l)
			l.Status.Conditions[0].Message = strings.Repeat("é", locksv1alpha1.MaxConditionMessage+1)
		}, actor: Actor{Username: alice}, rule: RuleBookkeeping, msg: msgConditions},
		{name: "Held with a terminal escape in its message", old: free(), edit: func(l *locksv1alpha1.DistributedLock) {
			addCondition(locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonNeverHeld)(l)
			l.Status.Conditions[0].Message = "free \x1b[2J"
		}, actor: Actor{Username: alice}, rule: RuleBookkeeping, msg: msgConditions},
		{name: "Held with a bidi override in its message", old: free(), edit: func(l *locksv1alpha1.DistributedLock) {
			addCondition(locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonNeverHeld)(l)
			l.Status.Conditions[0].Message = "free \u202e"
		}, actor: Actor{Username: alice}, rule: RuleBookkeeping, msg: msgConditions},
		{name: "Held with 256 characters of message", old: free(), edit: func(l *locksv1alpha1.DistributedLock) {
			addCondition(locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonNeverHeld)(l)
			l.Status.Conditions[0].Message = strings.Repeat("é", locksv1alpha1.MaxConditionMessage)
		}, actor: Actor{Username: alice}},
		{name: "Held with a paragraph separator in its message (red team)", old: free(), edit: func(l *locksv1alpha1.DistributedLock) {
			addCondition(locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonNeverHeld)(l)
			l.Status.Conditions[0].Message = "free\u2029Released by alice"
		}, actor: Actor{Username: alice}, rule: RuleBookkeeping, msg: msgConditions},
		{name: "acquire without the Held condition", old: free(), edit: func(l *locksv1alpha1.DistributedLock) {
			acquireAs(alice, "l1", "r1")(l)
			l.Status.Conditions = nil
		}, actor: Actor{Username: alice}, rule: RuleBookkeeping, msg: msgConditionsInStep},
		{name: "release keeping Held True", old: heldBy(alice), edit: func(l *locksv1alpha1.DistributedLock) {
			c := l.Status.Conditions
			end(locksv1alpha1.EndReasonReleased, alice)(l)
			l.Status.Conditions = c
		}, actor: Actor{Username: alice}, rule: RuleBookkeeping, msg: msgConditionsInStep},
		{name: "renew keeps conditions", old: heldBy(alice), edit: renew, actor: Actor{Username: alice}},
		{name: "a release that says Held False while a reader holds", old: reading(typed(rw, 0), alice, bob), edit: edits(endShared("lease-bob", locksv1alpha1.EndReasonReleased, bob), func(l *locksv1alpha1.DistributedLock) {
			l.Status.Conditions[0].Status, l.Status.Conditions[0].Reason = metav1.ConditionFalse, locksv1alpha1.ReasonReleased
		}), actor: Actor{Username: bob}, rule: RuleBookkeeping, msg: msgConditions},
		{name: "a reader acquiring without the Held condition", old: typed(rw, 0), edit: edits(share(bob, "l1", "r1", 0), func(l *locksv1alpha1.DistributedLock) { l.Status.Conditions = nil }),
			actor: Actor{Username: bob}, rule: RuleBookkeeping, msg: msgConditionsInStep},

		// time-format: the decoded check (the raw one is TestValidateRawStatusTimes)
		{name: "history time that Go cannot marshal back", old: heldBy(alice), edit: func(l *locksv1alpha1.DistributedLock) {
			l.EndHolding(locksv1alpha1.EndReasonReleased, alice, metav1.NewMicroTime(time.Date(0, 1, 1, 0, 30, 0, 0, time.FixedZone("", 3600))))
		}, actor: Actor{Username: alice}, rule: RuleTimeFormat, msg: msgMicroTime, crd: true},

		// managedFields
		{name: "a 17th managedFields apply entry", old: managers(heldBy(alice), MaxManagedFields), edit: addManager, actor: Actor{Username: bob}, rule: RuleBookkeeping, msg: msgManagedFields},
		{name: "a new update entry next to 16 apply entries", old: managers(heldBy(alice), MaxManagedFields), edit: func(l *locksv1alpha1.DistributedLock) {
			renew(l)
			l.ManagedFields = append(l.ManagedFields, metav1.ManagedFieldsEntry{Manager: "new-program", Operation: metav1.ManagedFieldsOperationUpdate, Subresource: "status"})
		}, actor: Actor{Username: alice}},
		{name: "a 16th managedFields entry", old: managers(heldBy(alice), MaxManagedFields-1), edit: addManager, actor: Actor{Username: bob}},
		{name: "a write that keeps 20 managedFields entries", old: managers(heldBy(alice), 20), edit: renew, actor: Actor{Username: alice}},
		{name: "the controller adds a 17th managedFields entry", old: managers(heldBy(alice), MaxManagedFields), edit: addManager, actor: Actor{Username: ctrlr, IsController: true}},
	})
}

func TestValidateRawStatusTimes(t *testing.T) {
	cases := []struct {
		name, json string
		deny       string // "" = allowed, else the path of the denial
	}{
		{"Go's own times", `{"status":{"holder":{"acquireTime":"2026-11-29T09:00:00.123456Z","renewTime":"2026-11-29T09:00:01.000000+01:00"},"waiters":[{"enqueueTime":"2026-11-29T09:00:00.000000Z","deadline":"2026-11-29T10:00:00.000000Z"}],"recentAcquisitions":[{"endTime":"2026-11-29T09:00:00.000000Z"}],"conditions":[{"lastTransitionTime":"2026-11-29T09:00:00Z"},{"lastTransitionTime":"2026-11-29T09:00:00.5-02:30"}]}}`, ""},
		{"no status", `{"metadata":{}}`, ""},
		{"lower-case t in a condition", `{"status":{"conditions":[{"lastTransitionTime":"2026-11-29t09:00:00Z"}]}}`, "status.conditions[0].lastTransitionTime"},
		{"lower-case z in a condition", `{"status":{"conditions":[{"lastTransitionTime":"2026-11-29T09:00:00z"}]}}`, "status.conditions[0].lastTransitionTime"},
		{"local time without zone", `{"status":{"conditions":[{"lastTransitionTime":"2026-11-29T09:00:00"}]}}`, "status.conditions[0].lastTransitionTime"},
		{"leap second", `{"status":{"conditions":[{"lastTransitionTime":"2026-12-31T23:59:60Z"}]}}`, "status.conditions[0].lastTransitionTime"},
		{"30 February", `{"status":{"conditions":[{"lastTransitionTime":"2026-02-30T09:00:00Z"}]}}`, "status.conditions[0].lastTransitionTime"},
		{"year 0 crossing into year -1", `{"status":{"conditions":[{"lastTransitionTime":"0000-01-01T00:30:00+01:00"}]}}`, "status.conditions[0].lastTransitionTime"},
		{"a number", `{"status":{"conditions":[{"lastTransitionTime":1}]}}`, "status.conditions[0].lastTransitionTime"},
		{"micro digits missing", `{"status":{"waiters":[{"enqueueTime":"2026-11-29T09:00:00Z","deadline":"2026-11-29T10:00:00.000000Z"}]}}`, "status.waiters[0].enqueueTime"},
		{"nine fraction digits in a MicroTime", `{"status":{"holder":{"acquireTime":"2026-11-29T09:00:00.123456789Z"}}}`, "status.holder.acquireTime"},
		{"year 9999 crossing into 10000", `{"status":{"recentAcquisitions":[{"endTime":"9999-12-31T23:30:00.000000-01:00"}]}}`, "status.recentAcquisitions[0].endTime"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			errs := ValidateRawStatusTimes([]byte(tc.json))
			if tc.deny == "" {
				if len(errs) > 0 {
					t.Fatalf("denied: %v", errs.ToAggregate())
				}
				return
			}
			if len(errs) != 1 || errs[0].Field != tc.deny || !strings.Contains(errs[0].Error(), "[kubelock:time-format] ") {
				t.Fatalf("got %v, want one time-format denial at %s", errs.ToAggregate(), tc.deny)
			}
		})
	}
}

// TestTimePatternsMatchGo holds the CRD patterns to Go's parsers: what Go's
// types marshal is accepted; what they cannot read back is refused.
func TestTimePatternsMatchGo(t *testing.T) {
	for _, tm := range []time.Time{
		time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC),
		time.Date(2026, 11, 29, 9, 0, 0, 999999999, time.FixedZone("", -9*3600-1800)),
		time.Date(2, 1, 1, 0, 30, 0, 0, time.FixedZone("", 3600)),
		time.Date(9998, 12, 31, 23, 30, 0, 0, time.FixedZone("", -3600)),
		time.Date(9998, 12, 31, 23, 59, 59, 0, time.UTC),
		time.Now(),
	} {
		mb, _ := metav1.NewMicroTime(tm).MarshalJSON()
		tb, _ := metav1.NewTime(tm).MarshalJSON()
		ms, ts := strings.Trim(string(mb), `"`), strings.Trim(string(tb), `"`)
		if !ValidMicroTime(ms) || !microTimeRE.MatchString(ms) {
			t.Errorf("MicroTime %s refused", ms)
		}
		if !ValidTime(ts) || !timeRE.MatchString(ts) {
			t.Errorf("Time %s refused", ts)
		}
	}
	for _, s := range []string{"2026-11-29t09:00:00.000000Z", "2026-11-29T09:00:00.000000z", "2026-11-29T09:00:00Z", "2026-11-29T09:00:00.0000000Z",
		"2026-11-29T09:00:60.000000Z", "2026-11-29T09:00:00.000000", "2026-11-29 09:00:00.000000Z", "0000-01-01T00:30:00.000000+01:00", "9999-12-31T23:30:00.000000-01:00",
		"0001-01-01T00:00:00.000000Z", "0001-12-31T23:00:00.000000+01:00", "9999-01-01T00:00:00.000000+00:00"} {
		if microTimeRE.MatchString(s) {
			t.Errorf("MicroTime pattern accepts %s", s)
		}
	}
}

// FuzzTimeStrings holds the CRD's time patterns (with the apiserver's own
// date-time format check) and the raw check to Go's parsers: whatever they
// accept, Go reads, and writes back in a form they accept again.
func FuzzTimeStrings(f *testing.F) {
	for _, s := range []string{"2026-11-29T09:00:00.123456Z", "2026-11-29T09:00:00Z", "2026-11-29t09:00:00.000000Z",
		"0000-01-01T00:30:00.000000+01:00", "9999-12-31T23:30:00.000000-01:00", "2026-02-29T09:00:00.000000Z",
		"2026-12-31T23:59:60.000000Z", "2026-11-29T09:00:00.000000+23:59", "2026-11-29T09:00:00.5-02:30"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		crd := strfmt.IsDateTime(s)
		if microTimeRE.MatchString(s) && crd {
			var m metav1.MicroTime
			if err := m.UnmarshalJSON(quote(s)); err != nil {
				t.Fatalf("the CRD accepts MicroTime %q, Go does not: %v", s, err)
			}
			if b, _ := m.MarshalJSON(); !ValidMicroTime(unquote(t, b)) {
				t.Fatalf("MicroTime %q is written back as %s, which the CRD refuses", s, b)
			}
		}
		if timeRE.MatchString(s) && crd {
			var m metav1.Time
			if err := m.UnmarshalJSON(quote(s)); err != nil {
				t.Fatalf("the pattern accepts Time %q, Go does not: %v", s, err)
			}
			if b, _ := m.MarshalJSON(); !ValidTime(unquote(t, b)) {
				t.Fatalf("Time %q is written back as %s, which the pattern refuses", s, b)
			}
		}
		raw := `{"status":{"holder":{"acquireTime":` + string(quote(s)) + `},"conditions":[{"lastTransitionTime":` + string(quote(s)) + `}]}}`
		if len(ValidateRawStatusTimes([]byte(raw))) == 0 {
			var l locksv1alpha1.DistributedLock
			if err := json.Unmarshal([]byte(raw), &l); err != nil {
				t.Fatalf("the raw check accepts %q, Go does not: %v", s, err)
			}
		}
		if v, err := strconv.Unquote(`"` + s + `"`); err == nil && ValidMicroTime(v) && !microTimeRE.MatchString(v) {
			t.Fatalf("ValidMicroTime accepts %q outside the pattern", v)
		}
	})
}

func unquote(t *testing.T, b []byte) string {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("unquote %s: %v", b, err)
	}
	return s
}

func quote(s string) []byte {
	b, _ := json.Marshal(s)
	return b
}
