package lockapiserver

import (
	"context"
	"testing"

	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// rbacLike allows what its rules allow, as RBAC does: a rule without names
// covers every name, a nameless request only such a rule. It records what it
// was asked.
type rbacLike struct {
	rules []rule
	asked []string
}

type rule struct{ verb, subresource, name string }

func (r *rbacLike) ConditionsAwareAuthorize(ctx context.Context, a authorizer.Attributes) authorizer.ConditionsAwareDecision {
	return authorizer.ConditionsAwareDecisionFromParts(r.Authorize(ctx, a))
}

func (*rbacLike) EvaluateConditions(context.Context, authorizer.ConditionsAwareDecision, authorizer.ConditionsData) (authorizer.Decision, string, error) {
	return authorizer.DecisionDeny, "", authorizer.ErrorConditionEvaluationNotSupported
}

func (r *rbacLike) Authorize(_ context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
	r.asked = append(r.asked, a.GetVerb()+" "+a.GetResource()+"/"+a.GetSubresource()+" "+a.GetName())
	for _, x := range r.rules {
		if x.verb == a.GetVerb() && x.subresource == a.GetSubresource() && (x.name == "" || x.name == a.GetName()) {
			return authorizer.DecisionAllow, "", nil
		}
	}
	return authorizer.DecisionNoOpinion, "", nil
}

func TestByNamespaceAsksOncePerNamespaceAndStillHonoursNames(t *testing.T) {
	lockReq := func(verb, sub, name string) authorizer.AttributesRecord {
		return authorizer.AttributesRecord{User: &user.DefaultInfo{Name: "alice"}, Verb: verb, Namespace: "ns",
			APIGroup: locksv1alpha1.GroupVersion.Group, APIVersion: "v1alpha1", Resource: "distributedlocks",
			Subresource: sub, Name: name, ResourceRequest: true}
	}
	cases := []struct {
		name  string
		rules []rule
		req   authorizer.AttributesRecord
		allow bool
		asked []string
	}{
		{"a user with every lock's status is answered by namespace", []rule{{"update", "status", ""}},
			lockReq("update", "status", "orders"), true, []string{"update distributedlocks/status "}},
		{"a user limited to some names is asked about the name", []rule{{"update", "status", "orders"}},
			lockReq("update", "status", "orders"), true, []string{"update distributedlocks/status ", "update distributedlocks/status orders"}},
		{"a user limited to other names is denied", []rule{{"update", "status", "billing"}},
			lockReq("update", "status", "orders"), false, []string{"update distributedlocks/status ", "update distributedlocks/status orders"}},
		{"a user without the verb is denied", []rule{{"get", "status", ""}},
			lockReq("update", "status", "orders"), false, []string{"update distributedlocks/status ", "update distributedlocks/status orders"}},
		{"a list names nothing and is asked as it came", []rule{{"list", "", ""}},
			lockReq("list", "", ""), true, []string{"list distributedlocks/ "}},
		{"a kubelock verb is asked by name", []rule{{"force-release", "", ""}},
			lockReq("force-release", "", "orders"), true, []string{"force-release distributedlocks/ orders"}},
	}
	other := lockReq("update", "", "kube-system-thing")
	other.APIGroup = "apps"
	cases = append(cases, struct {
		name  string
		rules []rule
		req   authorizer.AttributesRecord
		allow bool
		asked []string
	}{"another group's request is asked as it came", []rule{{"update", "", ""}}, other, true, []string{"update distributedlocks/ kube-system-thing"}})

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			delegate := &rbacLike{rules: tc.rules}
			d, _, err := byNamespace{delegate}.Authorize(context.Background(), tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if got := d == authorizer.DecisionAllow; got != tc.allow {
				t.Errorf("allowed %v, want %v", got, tc.allow)
			}
			if len(delegate.asked) != len(tc.asked) {
				t.Fatalf("asked %q, want %q", delegate.asked, tc.asked)
			}
			for i := range tc.asked {
				if delegate.asked[i] != tc.asked[i] {
					t.Errorf("asked %q, want %q", delegate.asked, tc.asked)
				}
			}
		})
	}
}
