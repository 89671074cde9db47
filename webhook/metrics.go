package webhook

import "github.com/kubelock/kubelock/internal/metrics"

// The webhook's metrics live in internal/metrics
// (kubelock_webhook_admission_decisions_total{rule,outcome},
// kubelock_webhook_stale_token_rejections_total{lock}).

func observe(rule Rule, allowed bool) { metrics.AdmissionDecision(string(rule), allowed) }
