package admission

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/google/cel-go/cel"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/admission"
	celadm "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	authnuser "k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/cel/environment"
	"sigs.k8s.io/yaml"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/test/testenv"
)

// statusPolicy is config/policy's status policy compiled with the
// apiserver's own admission CEL library, the version the test control plane
// runs. It answers what the apiserver's policy engine would answer for one
// write, and how much of the runtime cost budget the validations spent, which
// the apiserver does not report. The apiserver itself is the judge (the
// admission suite runs the same writes there); this is the measuring tape.
type statusPolicy struct {
	compiler    *celadm.CompositedCompiler
	validations celadm.ConditionEvaluator
	validator   validating.Validator
}

// compileStatusPolicy reads and compiles config/policy/validating_admission_policy.yaml.
func compileStatusPolicy() (*statusPolicy, error) {
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "policy", "validating_admission_policy.yaml"))
	if err != nil {
		return nil, err
	}
	vap := &admissionregistrationv1.ValidatingAdmissionPolicy{}
	if err := yaml.UnmarshalStrict(b, vap); err != nil {
		return nil, err
	}
	vap.Spec.Variables[0].Expression = fmt.Sprintf("'%s'", controllerUser)
	compiler, err := celadm.NewCompositedCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
	if err != nil {
		return nil, err
	}
	withAuthz := celadm.OptionalVariableDeclarations{HasAuthorizer: true}
	vars := make([]celadm.NamedExpressionAccessor, len(vap.Spec.Variables))
	for i, v := range vap.Spec.Variables {
		vars[i] = &validating.Variable{Name: v.Name, Expression: v.Expression}
	}
	for _, v := range vars {
		if r := compiler.CompileAndStoreVariable(v, withAuthz, environment.StoredExpressions); r.Error != nil {
			return nil, fmt.Errorf("variable %s: %w", v.GetName(), r.Error)
		}
	}
	conds := make([]celadm.ExpressionAccessor, len(vap.Spec.Validations))
	msgs := make([]celadm.ExpressionAccessor, len(vap.Spec.Validations))
	for i, v := range vap.Spec.Validations {
		conds[i] = &validating.ValidationCondition{Expression: v.Expression, Message: v.Message, Reason: v.Reason}
		if v.MessageExpression != "" {
			msgs[i] = &validating.MessageExpressionCondition{MessageExpression: v.MessageExpression}
		}
	}
	validations := compiler.CompileCondition(conds, withAuthz, environment.StoredExpressions)
	messages := compiler.CompileCondition(msgs, celadm.OptionalVariableDeclarations{}, environment.StoredExpressions)
	for _, cs := range [][]error{validations.CompilationErrors(), messages.CompilationErrors()} {
		if len(cs) > 0 {
			return nil, fmt.Errorf("compiling the policy: %v", cs)
		}
	}
	return &statusPolicy{
		compiler:    compiler,
		validations: validations,
		validator: validating.NewValidator(validations, nil,
			compiler.CompileCondition(nil, celadm.OptionalVariableDeclarations{}, environment.StoredExpressions),
			messages, vap.Spec.FailurePolicy, nil),
	}, nil
}

// policyWriter is who writes, as request.userInfo shows it.
type policyWriter struct {
	name  string
	extra map[string][]string
	// forceRelease is the authorizer's answer for the force-release verb.
	forceRelease bool
}

// judge evaluates the policy for a status UPDATE oldObj → newObj by w: the
// first denial's message ("" when admitted, like the apiserver, which reports
// the first failing validation) and the cost the validations spent.
func (p *statusPolicy) judge(ctx context.Context, oldObj, newObj *locksv1alpha1.DistributedLock, w policyWriter) (string, int64, error) {
	attr, err := statusAttributes(oldObj, newObj, w)
	if err != nil {
		return "", 0, err
	}
	authz := fixedAuthorizer(w.forceRelease)
	req := celadm.CreateAdmissionRequest(attr.Attributes, metav1.GroupVersionResource(statusResource), metav1.GroupVersionKind(attr.VersionedKind))
	_, remaining, err := p.validations.ForInput(ctx, attr, req, celadm.OptionalVariableBindings{Authorizer: authz}, nil, celconfig.RuntimeCELCostBudget)
	if err != nil {
		return "", 0, err
	}
	res := p.validator.Validate(ctx, attr.GetResource(), attr, nil, nil, celconfig.RuntimeCELCostBudget, authz)
	for _, d := range res.Decisions {
		if d.Evaluation == validating.EvalError {
			return "", celconfig.RuntimeCELCostBudget - remaining, fmt.Errorf("policy evaluation error: %s", d.Message)
		}
		if d.Action == validating.ActionDeny {
			return d.Message, celconfig.RuntimeCELCostBudget - remaining, nil
		}
	}
	return "", celconfig.RuntimeCELCostBudget - remaining, nil
}

var statusResource = locksv1alpha1.GroupVersion.WithResource("distributedlocks")

func statusAttributes(oldObj, newObj *locksv1alpha1.DistributedLock, w policyWriter) (*admission.VersionedAttributes, error) {
	o, err := toUnstructured(oldObj)
	if err != nil {
		return nil, err
	}
	n, err := toUnstructured(newObj)
	if err != nil {
		return nil, err
	}
	gvk := locksv1alpha1.GroupVersion.WithKind("DistributedLock")
	info := &authnuser.DefaultInfo{Name: w.name, Extra: w.extra}
	a := admission.NewAttributesRecord(n, o, gvk, oldObj.Namespace, oldObj.Name, statusResource, "status", admission.Update, nil, false, info)
	return &admission.VersionedAttributes{
		Attributes: a, VersionedKind: gvk,
		VersionedOldObject: admission.NewLazyObject(o), VersionedObject: admission.NewLazyObject(n),
	}, nil
}

func toUnstructured(l *locksv1alpha1.DistributedLock) (*unstructured.Unstructured, error) {
	l = l.DeepCopy()
	l.APIVersion, l.Kind = locksv1alpha1.GroupVersion.String(), "DistributedLock"
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(l)
	return &unstructured.Unstructured{Object: m}, err
}

// fixedAuthorizer allows every check, or none.
type fixedAuthorizer bool

func (f fixedAuthorizer) Authorize(context.Context, authorizer.Attributes) (authorizer.Decision, string, error) {
	if f {
		return authorizer.DecisionAllow, "", nil
	}
	return authorizer.DecisionDeny, "", nil
}

// eval evaluates one CEL expression with the policy's variables for a write,
// for tests that look inside the policy: its value as a string (or a
// compilation or evaluation error) and its cost.
func (p *statusPolicy) eval(ctx context.Context, oldObj, newObj *locksv1alpha1.DistributedLock, w policyWriter, expr string) (string, int64, error) {
	attr, err := statusAttributes(oldObj, newObj, w)
	if err != nil {
		return "", 0, err
	}
	c := p.compiler.CompileCondition([]celadm.ExpressionAccessor{anyExpression(expr)},
		celadm.OptionalVariableDeclarations{HasAuthorizer: true}, environment.StoredExpressions)
	if errs := c.CompilationErrors(); len(errs) > 0 {
		return "", 0, fmt.Errorf("%v", errs)
	}
	req := celadm.CreateAdmissionRequest(attr.Attributes, metav1.GroupVersionResource(statusResource), metav1.GroupVersionKind(attr.VersionedKind))
	res, remaining, err := c.ForInput(ctx, attr, req, celadm.OptionalVariableBindings{Authorizer: fixedAuthorizer(w.forceRelease)}, nil, celconfig.RuntimeCELCostBudget)
	if err != nil {
		return "", 0, err
	}
	if res[0].Error != nil {
		return "", 0, res[0].Error
	}
	return fmt.Sprint(res[0].EvalResult.Value()), celconfig.RuntimeCELCostBudget - remaining, nil
}

// anyExpression is an expression of any type.
type anyExpression string

func (e anyExpression) GetExpression() string  { return string(e) }
func (anyExpression) ReturnTypes() []*cel.Type { return []*cel.Type{cel.AnyType} }
