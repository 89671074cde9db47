package webhook

import (
	"regexp"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/validation/field"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// admissionDecisions counts decisions by rule and outcome; allowed requests
// count under rule "none".
var admissionDecisions = prometheus.NewCounterVec(prometheus.CounterOpts{
	Namespace: "kubelock",
	Subsystem: "webhook",
	Name:      "admission_decisions_total",
	Help:      "Admission decisions on DistributedLock writes, by rule and outcome (allowed or denied).",
}, []string{"rule", "outcome"})

// staleTokenRejections counts writes to fenced Kubernetes objects refused for a stale token.
// Fenced objects are few, so one series per guarding lock stays bounded.
var staleTokenRejections = prometheus.NewCounterVec(prometheus.CounterOpts{
	Namespace: "kubelock",
	Subsystem: "webhook",
	Name:      "stale_token_rejections_total",
	Help:      "Updates of objects fenced by a lock that were denied for a stale or unissued fencing token, by lock (namespace/name).",
}, []string{"lock"})

func init() { ctrlmetrics.Registry.MustRegister(admissionDecisions, staleTokenRejections) }

func observe(rule Rule, allowed bool) {
	outcome, r := "denied", string(rule)
	if allowed {
		outcome, r = "allowed", "none"
	}
	admissionDecisions.WithLabelValues(r, outcome).Inc()
}

var ruleTag = regexp.MustCompile(`\[kubelock:([a-z-]+)\]`)

// ruleOf reads the rule tag from an error built by deny; "internal" otherwise.
func ruleOf(e *field.Error) Rule {
	if m := ruleTag.FindStringSubmatch(e.Detail); m != nil {
		return Rule(m[1])
	}
	return "internal"
}
