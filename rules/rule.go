// Package rules is kubelock's admission rules as pure functions: given the
// old and new object and who writes (an Actor), each Validate… function says
// which rules a write breaks, as a field.ErrorList whose errors carry their
// Rule in Origin. Only the holder renews or releases, only the queue head
// acquires, tokens are the server's and nobody writes a name other than their
// own. The webhook (webhook/) and any server that stores locks call them; the
// same rules exist in CEL as config/policy's ValidatingAdmissionPolicies, and
// one hostile-input suite (test/admission) proves the two engines equal.
//
// The files follow docs/design.md's Transitions table: a status write
// (status.go) is an acquisition (acquire.go), a renewal or release
// (renew.go), a queue's join or leave (queue.go), ends recorded in
// recentAcquisitions and force-release (end.go), and the counts, conditions,
// times and managedFields every write keeps true (bookkeeping.go). The main
// resource's create, metadata and delete (metadata.go), sessions (session.go)
// and the objects a lock fences (fenced.go) have their own. Who writes, its
// pod and its verbs are actor.go's.
package rules

import (
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Rule names an admission rule. Every denial message starts with
// "[kubelock:<rule>]" in both engines, so users and tests can tell which rule failed.
type Rule string

// The rule table: docs/security.md says what each rule guards, docs/design.md
// "Transitions" when it applies.
const (
	RuleIdentity       Rule = "identity"
	RulePodBinding     Rule = "pod-binding"
	RuleHolderOnly     Rule = "holder-only"
	RuleHolderFields   Rule = "holder-fields"
	RuleQueueHead      Rule = "queue-head"
	RuleFencingToken   Rule = "fencing-token"
	RuleEndRecord      Rule = "end-record"
	RuleControllerOnly Rule = "controller-only"
	RuleForceRelease   Rule = "force-release"
	RuleQueue          Rule = "queue"
	RuleHistory        Rule = "history"
	RuleHeldDelete     Rule = "held-delete"
	RuleBookkeeping    Rule = "bookkeeping"
	RuleTimeFormat     Rule = "time-format"
	RuleWaitBound      Rule = "wait-bound"
	RuleLeaseID        Rule = "lease-id"
	RuleTerminating    Rule = "terminating"
	// Shared modes: a holding's mode fits the lock's type; a shared
	// holding's slot is free, in range, and never changes.
	RuleMode Rule = "mode"
	RuleSlot Rule = "slot"
	// The main resource's; RuleHeldDelete covers finalizers too.
	RuleForceDelete Rule = "force-delete"
	RuleCreate      Rule = "create"
	// Fenced objects'.
	RuleStaleToken   Rule = "stale-token"
	RuleFencedWriter Rule = "fenced-writer"
	RuleFencedBy     Rule = "fenced-by"
	// LockSessions' and the session fields of locks.
	RuleSession Rule = "session"
)

// deny builds an error whose message starts with the rule's tag; the rule
// itself travels as the error's Origin (RuleOf), never parsed from the message.
func deny(p *field.Path, r Rule, format string, args ...any) *field.Error {
	return field.Forbidden(p, fmt.Sprintf("[kubelock:%s] ", r)+fmt.Sprintf(format, args...)).WithOrigin(string(r))
}

// RuleOf is the rule of a denial; "" for an error no rule made.
func RuleOf(e *field.Error) Rule { return Rule(e.Origin) }

// Failed reports whether errs holds an error no rule made (a verb check that
// could not be asked, a stored lock whose resourceVersion is no integer): the
// write was not judged, so a server answers with an error, not a denial, and
// the writer tries again.
func Failed(errs field.ErrorList) bool {
	return slices.ContainsFunc(errs, func(e *field.Error) bool { return RuleOf(e) == "" })
}

// The paths denials name.
var (
	statusPath     = field.NewPath("status")
	holderPath     = statusPath.Child("holder")
	sharedPath     = statusPath.Child("sharedHolders")
	tokenPath      = statusPath.Child("fencingToken")
	waitersPath    = statusPath.Child("waiters")
	recentPath     = statusPath.Child("recentAcquisitions")
	conditionsPath = statusPath.Child("conditions")
	metadataPath   = field.NewPath("metadata")
	specPath       = field.NewPath("spec")
	finalizersPath = metadataPath.Child("finalizers")
)
