package webhook

import (
	"regexp"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kubelock/kubelock/internal/metrics"
)

// The webhook's metrics live in internal/metrics
// (kubelock_webhook_admission_decisions_total{rule,outcome},
// kubelock_webhook_stale_token_rejections_total{lock}); they are registered
// when a validator is built.

func observe(rule Rule, allowed bool) { metrics.AdmissionDecision(string(rule), allowed) }

var ruleTag = regexp.MustCompile(`\[kubelock:([a-z-]+)\]`)

// ruleOf reads the rule tag from an error built by deny; "internal" otherwise.
func ruleOf(e *field.Error) Rule {
	if m := ruleTag.FindStringSubmatch(e.Detail); m != nil {
		return Rule(m[1])
	}
	return "internal"
}
