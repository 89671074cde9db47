package lockapiserver

import (
	"context"

	"k8s.io/apiserver/pkg/authorization/authorizer"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// byNamespace answers a request for one lock object (get, update, patch,
// delete) from the user's access to every object of its kind in the
// namespace, when the user has that, and asks about the object's name only
// when not. The delegated authorizer keeps each answer for 10 s keyed by
// every attribute, the name among them; renewals come every 10 s and
// acquisitions pick locks among thousands, so asked by name nearly every lock
// write would cost the cluster's kube-apiserver a SubjectAccessReview (and
// wait for it). Asked by namespace, a user's writes share one answer. RBAC
// allows a nameless request only by a rule that covers every name, so the
// answer is the same; a user limited to some names (resourceNames) is still
// asked about the name. An authorizer that allows a whole namespace but
// denies names within it is not RBAC's semantics: turn this off for it
// (--authorize-by-namespace=false).
type byNamespace struct{ delegate authorizer.Authorizer }

// oneObjectVerbs are the verbs of requests that name one object.
var oneObjectVerbs = map[string]bool{"get": true, "update": true, "patch": true, "delete": true}

func (a byNamespace) Authorize(ctx context.Context, attrs authorizer.Attributes) (authorizer.Decision, string, error) {
	if attrs.IsResourceRequest() && attrs.GetName() != "" && oneObjectVerbs[attrs.GetVerb()] &&
		attrs.GetAPIGroup() == locksv1alpha1.GroupVersion.Group {
		wide := authorizer.AttributesRecord{
			User: attrs.GetUser(), Verb: attrs.GetVerb(), Namespace: attrs.GetNamespace(),
			APIGroup: attrs.GetAPIGroup(), APIVersion: attrs.GetAPIVersion(),
			Resource: attrs.GetResource(), Subresource: attrs.GetSubresource(),
			ResourceRequest: true, Path: attrs.GetPath(),
		}
		if d, reason, err := a.delegate.Authorize(ctx, wide); err == nil && d == authorizer.DecisionAllow {
			return d, reason, nil
		}
	}
	return a.delegate.Authorize(ctx, attrs)
}

// ConditionsAwareAuthorize is Authorize's answer, as the interface asks of an
// authorizer that is not conditions-aware (so that neither entry point
// bypasses the other).
func (a byNamespace) ConditionsAwareAuthorize(ctx context.Context, attrs authorizer.Attributes) authorizer.ConditionsAwareDecision {
	return authorizer.ConditionsAwareDecisionFromParts(a.Authorize(ctx, attrs))
}

// EvaluateConditions fails closed: byNamespace makes no conditional decisions.
func (byNamespace) EvaluateConditions(context.Context, authorizer.ConditionsAwareDecision, authorizer.ConditionsData) (authorizer.Decision, string, error) {
	return authorizer.DecisionDeny, "", authorizer.ErrorConditionEvaluationNotSupported
}
