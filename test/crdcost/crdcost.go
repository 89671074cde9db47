// Package crdcost runs a DistributedLock CRD's schema work for one status
// write the way kube-apiserver does, in-process and with the apiserver's own
// code (k8s.io/apiextensions-apiserver at the version the test control plane
// runs): structural defaulting and pruning of the decoded object, the status
// strategy's OpenAPI validation and list-map checks, and the
// x-kubernetes-validations rules in CEL. It is the measuring tape for "less
// schema work per write" (docs/design.md, "The CRD's rules"): how long that
// work takes and what CEL costs, for the generated CRD and for any other CRD
// file, such as an older commit's.
package crdcost

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel/model"
	structuraldefaulting "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	structurallisttype "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/listtype"
	structuralpruning "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apimachinery/pkg/runtime"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/cel/common"
	"k8s.io/apiserver/pkg/cel/environment"
	"sigs.k8s.io/yaml"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/test/testenv"
)

// Schema is one CRD version's schema work, built as the apiserver builds it
// when it starts serving the CRD.
type Schema struct {
	structural *structuralschema.Structural
	// status validates status against its OpenAPI schema (kube-openapi).
	status apiservervalidation.SchemaValidator
	cel    *cel.Validator
}

// Load reads a CustomResourceDefinition of DistributedLocks from path.
func Load(path string) (*Schema, error) {
	props, structural, err := internalSchema(path)
	if err != nil {
		return nil, err
	}
	statusProps := props.Properties["status"]
	status, _, err := apiservervalidation.NewSchemaValidator(&statusProps)
	if err != nil {
		return nil, err
	}
	return &Schema{structural: structural, status: status, cel: cel.NewValidator(structural, true, celconfig.PerCallLimit)}, nil
}

// GeneratedCRD is the path of the CRD `make manifests` generates.
func GeneratedCRD() string {
	return filepath.Join(testenv.RepoRoot(), "config", "crd", "bases", "locks.kubelock.io_distributedlocks.yaml")
}

// ReadCRD reads a CustomResourceDefinition of one version with a schema.
func ReadCRD(path string) (*apiextensionsv1.CustomResourceDefinition, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(b, crd); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(crd.Spec.Versions) != 1 || crd.Spec.Versions[0].Schema == nil {
		return nil, fmt.Errorf("%s: want one version with a schema", path)
	}
	return crd, nil
}

// internalSchema is the one schema of the CRD in path as the apiserver holds it.
func internalSchema(path string) (*apiextensions.JSONSchemaProps, *structuralschema.Structural, error) {
	crd, err := ReadCRD(path)
	if err != nil {
		return nil, nil, err
	}
	internal := &apiextensions.CustomResourceValidation{}
	if err := apiextensionsv1.Convert_v1_CustomResourceValidation_To_apiextensions_CustomResourceValidation(crd.Spec.Versions[0].Schema, internal, nil); err != nil {
		return nil, nil, err
	}
	structural, err := structuralschema.NewStructural(internal.OpenAPIV3Schema)
	if err != nil {
		return nil, nil, err
	}
	return internal.OpenAPIV3Schema, structural, nil
}

// Write is one status write: the stored object and the one a client sends,
// as the JSON objects the apiserver decodes.
type Write struct {
	old, new map[string]any
}

// NewWrite is the status write oldObj → newObj.
func NewWrite(oldObj, newObj *locksv1alpha1.DistributedLock) (Write, error) {
	o, err := asJSONObject(oldObj)
	if err != nil {
		return Write{}, err
	}
	n, err := asJSONObject(newObj)
	return Write{old: o, new: n}, err
}

// asJSONObject is l as the apiserver's JSON decoder gives it (int64 numbers).
func asJSONObject(l *locksv1alpha1.DistributedLock) (map[string]any, error) {
	l = l.DeepCopy()
	l.APIVersion, l.Kind = locksv1alpha1.GroupVersion.String(), "DistributedLock"
	b, err := json.Marshal(l)
	if err != nil {
		return nil, err
	}
	m := map[string]any{}
	if err := utiljson.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	return m, nil
}

// StatusUpdate does the schema work of w that the apiserver does for a
// status update, from decoding the request to validating it, and returns the
// validation errors and what the CEL rules cost (in the apiserver's units,
// of celconfig.RuntimeCELCostBudget per request). It follows
// k8s.io/apiextensions-apiserver/pkg/registry/customresource's status
// strategy, whose package (it links the apiserver's storage) this module
// does not import; object metadata checks, which no CRD changes, are left out.
func (s *Schema) StatusUpdate(ctx context.Context, w Write) (field.ErrorList, int64) {
	n, o := s.prepare(w)
	correlated := common.NewCorrelatedObject(n, o, &model.Structural{Structural: s.structural})
	errs := apiservervalidation.ValidateCustomResourceUpdate(field.NewPath("status"), n["status"], o["status"], s.status,
		apiservervalidation.WithRatcheting(correlated.Key("status")))
	if newErrs := structurallisttype.ValidateListSetsAndMaps(nil, s.structural, n); len(newErrs) > 0 {
		if oldErrs := structurallisttype.ValidateListSetsAndMaps(nil, s.structural, o); len(oldErrs) == 0 {
			errs = append(errs, newErrs...)
		}
	}
	if s.cel == nil || blocking(errs) {
		return errs, 0
	}
	celErrs, remaining := s.cel.Validate(ctx, nil, s.structural, n, o, celconfig.RuntimeCELCostBudget, cel.WithRatcheting(correlated))
	return append(errs, celErrs...), celconfig.RuntimeCELCostBudget - remaining
}

// prepare is w as the status strategy validates it: the request body
// defaulted and pruned by the decoder, then everything but status taken from
// the stored object.
func (s *Schema) prepare(w Write) (n, o map[string]any) {
	n, o = deepCopy(w.new), deepCopy(w.old)
	structuraldefaulting.Default(n, s.structural)
	structuralpruning.PruneWithOptions(n, s.structural, true, structuralschema.UnknownFieldPathOptions{})
	status, ok := n["status"]
	n = deepCopy(o)
	delete(n, "status")
	if ok {
		n["status"] = status
	}
	return n, o
}

// blocking reports errors after which the apiserver skips the CEL rules.
func blocking(errs field.ErrorList) bool {
	for _, e := range errs {
		switch e.Type {
		case field.ErrorTypeNotSupported, field.ErrorTypeRequired, field.ErrorTypeTooLong, field.ErrorTypeTooMany, field.ErrorTypeTypeInvalid:
			return true
		}
	}
	return false
}

func deepCopy(m map[string]any) map[string]any {
	return runtime.DeepCopyJSON(m)
}

// Rule is one x-kubernetes-validations rule of a CRD.
type Rule struct {
	// Path is where the rule sits: "" for the object, then fields, [*] for list items.
	Path    string
	Rule    string
	Message string
	// Transition: the rule compares with oldSelf.
	Transition bool
	// Cost is the apiserver's static estimate for one evaluation; Calls how
	// often the rule can run for one object (the product of the maxItems of
	// the lists above it; 0 under a list without maxItems). The apiserver
	// refuses a CRD whose Cost × Calls exceeds 10,000,000 for a rule, or
	// 100,000,000 summed over its rules.
	Cost, Calls uint64
}

// Rules lists the CEL rules of the CRD in path, with their cost estimates.
func Rules(path string) ([]Rule, error) {
	_, structural, err := internalSchema(path)
	if err != nil {
		return nil, err
	}
	var out []Rule
	err = walk(structural, "", 1, true, func(s *structuralschema.Structural, path string, calls uint64, root bool) error {
		if len(s.XValidations) == 0 {
			return nil
		}
		results, err := cel.Compile(s, model.SchemaDeclType(s, root), celconfig.PerCallLimit,
			environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()), cel.NewExpressionsEnvLoader())
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		for i, r := range results {
			if r.Error != nil {
				return fmt.Errorf("%s: %s: %w", path, s.XValidations[i].Rule, r.Error)
			}
			out = append(out, Rule{Path: path, Rule: s.XValidations[i].Rule, Message: s.XValidations[i].Message,
				Transition: r.UsesOldSelf, Cost: r.MaxCost, Calls: calls})
		}
		return nil
	})
	sort.SliceStable(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, err
}

// walk visits every node of s with its path and how often it can occur in
// one object (0: without bound).
func walk(s *structuralschema.Structural, path string, calls uint64, root bool, visit func(*structuralschema.Structural, string, uint64, bool) error) error {
	if err := visit(s, path, calls, root); err != nil {
		return err
	}
	names := make([]string, 0, len(s.Properties))
	for name := range s.Properties {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		p := s.Properties[name]
		if err := walk(&p, path+"."+name, calls, false, visit); err != nil {
			return err
		}
	}
	if s.Items != nil {
		n := uint64(0)
		if s.ValueValidation != nil && s.ValueValidation.MaxItems != nil {
			n = uint64(*s.ValueValidation.MaxItems)
		}
		return walk(s.Items, path+"[*]", calls*n, false, visit)
	}
	return nil
}
