// Package policytest compiles config/policy's status policy with the
// apiserver's own admission CEL library (the version the test control plane
// runs) and evaluates it for one write, outside any apiserver: what the
// policy engine answers and how much of its runtime cost budget the
// validations spent, which the apiserver does not report. The apiserver is
// the judge (test/admission runs every case there against both engines);
// this is the measuring tape, and a quick check that the policy says what the
// webhook says.
package policytest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"

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
)

// Policy is the compiled status policy.
type Policy struct {
	compiler    *celadm.CompositedCompiler
	validations celadm.ConditionEvaluator
	validator   validating.Validator
}

// RepoRoot is the repository's root directory.
func RepoRoot() string {
	_, file, _, _ := goruntime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Load reads and compiles config/policy/validating_admission_policy.yaml with
// controllerUser as its controller ("" keeps the shipped name).
func Load(controllerUser string) (*Policy, error) {
	b, err := os.ReadFile(filepath.Join(RepoRoot(), "config", "policy", "validating_admission_policy.yaml"))
	if err != nil {
		return nil, err
	}
	vap := &admissionregistrationv1.ValidatingAdmissionPolicy{}
	if err := yaml.UnmarshalStrict(b, vap); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, v := range vap.Spec.Variables {
		if seen[v.Name] {
			// A later variable of the same name silently replaces the earlier.
			return nil, fmt.Errorf("variable %s is defined twice", v.Name)
		}
		seen[v.Name] = true
	}
	if controllerUser != "" {
		vap.Spec.Variables[0].Expression = fmt.Sprintf("'%s'", controllerUser)
	}
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
	return &Policy{
		compiler:    compiler,
		validations: validations,
		validator: validating.NewValidator(validations, nil,
			compiler.CompileCondition(nil, celadm.OptionalVariableDeclarations{}, environment.StoredExpressions),
			messages, vap.Spec.FailurePolicy, nil),
	}, nil
}

// Writer is who writes, as request.userInfo shows it.
type Writer struct {
	Name  string
	Extra map[string][]string
	// ForceRelease is the authorizer's answer for the force-release verb.
	ForceRelease bool
}

// EvalErrorPrefix starts the error Judge returns when a validation fails to
// evaluate: the apiserver then denies by the policy's failurePolicy.
const EvalErrorPrefix = "policy evaluation error: "

// Judge evaluates the policy for a status UPDATE oldObj → newObj by w: the
// first denial's message ("" when admitted; the apiserver too reports the
// first failing validation) and the cost the validations spent, of
// celconfig.RuntimeCELCostBudget.
func (p *Policy) Judge(ctx context.Context, oldObj, newObj *locksv1alpha1.DistributedLock, w Writer) (string, int64, error) {
	attr, err := statusAttributes(oldObj, newObj, w)
	if err != nil {
		return "", 0, err
	}
	authz := fixedAuthorizer(w.ForceRelease)
	req := celadm.CreateAdmissionRequest(attr.Attributes, metav1.GroupVersionResource(statusResource), metav1.GroupVersionKind(attr.VersionedKind))
	_, remaining, err := p.validations.ForInput(ctx, attr, req, celadm.OptionalVariableBindings{Authorizer: authz}, nil, celconfig.RuntimeCELCostBudget)
	if err != nil {
		return "", 0, err
	}
	res := p.validator.Validate(ctx, attr.GetResource(), attr, nil, nil, celconfig.RuntimeCELCostBudget, authz)
	for _, d := range res.Decisions {
		if d.Evaluation == validating.EvalError {
			return "", celconfig.RuntimeCELCostBudget - remaining, fmt.Errorf("%s%s", EvalErrorPrefix, d.Message)
		}
		if d.Action == validating.ActionDeny {
			return d.Message, celconfig.RuntimeCELCostBudget - remaining, nil
		}
	}
	return "", celconfig.RuntimeCELCostBudget - remaining, nil
}

var statusResource = locksv1alpha1.GroupVersion.WithResource("distributedlocks")

func statusAttributes(oldObj, newObj *locksv1alpha1.DistributedLock, w Writer) (*admission.VersionedAttributes, error) {
	o, err := toUnstructured(oldObj)
	if err != nil {
		return nil, err
	}
	n, err := toUnstructured(newObj)
	if err != nil {
		return nil, err
	}
	gvk := locksv1alpha1.GroupVersion.WithKind("DistributedLock")
	info := &authnuser.DefaultInfo{Name: w.Name, Extra: w.Extra}
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

// Eval evaluates one CEL expression with the policy's variables for a write,
// for tests that look inside the policy: its value printed (or a compilation
// or evaluation error) and its cost.
func (p *Policy) Eval(ctx context.Context, oldObj, newObj *locksv1alpha1.DistributedLock, w Writer, expr string) (string, int64, error) {
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
	res, remaining, err := c.ForInput(ctx, attr, req, celadm.OptionalVariableBindings{Authorizer: fixedAuthorizer(w.ForceRelease)}, nil, celconfig.RuntimeCELCostBudget)
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
