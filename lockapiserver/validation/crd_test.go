package validation

import (
	"context"
	"encoding/json"
	"io/fs"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel/model"
	structuraldefaulting "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	structurallisttype "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/listtype"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/cel/common"
	"sigs.k8s.io/yaml"

	"github.com/kubelock/kubelock/config"
)

// crd is one generated CRD's schema work as kube-apiserver does it: the
// oracle the Go checks and defaults are held to.
type crd struct {
	structural *structuralschema.Structural
	schema     apiservervalidation.SchemaValidator
	cel        *cel.Validator
}

func loadCRD(t testing.TB, plural string) *crd {
	t.Helper()
	b, err := fs.ReadFile(config.FS, "crd/bases/locks.kubelock.io_"+plural+".yaml")
	if err != nil {
		t.Fatal(err)
	}
	v1 := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(b, v1); err != nil {
		t.Fatal(err)
	}
	internal := &apiextensions.CustomResourceValidation{}
	if err := apiextensionsv1.Convert_v1_CustomResourceValidation_To_apiextensions_CustomResourceValidation(v1.Spec.Versions[0].Schema, internal, nil); err != nil {
		t.Fatal(err)
	}
	s, err := structuralschema.NewStructural(internal.OpenAPIV3Schema)
	if err != nil {
		t.Fatal(err)
	}
	v, _, err := apiservervalidation.NewSchemaValidator(internal.OpenAPIV3Schema)
	if err != nil {
		t.Fatal(err)
	}
	return &crd{structural: s, schema: v, cel: cel.NewValidator(s, true, celconfig.PerCallLimit)}
}

// validate is the CRD's verdict on obj (oldObj nil: a create), both as
// the apiserver's JSON decoder gives them. An update ratchets as the
// apiserver's does: a value the stored object already has is not refused
// for a bound it no longer meets.
func (c *crd) validate(obj, oldObj map[string]any) field.ErrorList {
	if oldObj == nil {
		errs := apiservervalidation.ValidateCustomResource(nil, obj, c.schema)
		errs = append(errs, structurallisttype.ValidateListSetsAndMaps(nil, c.structural, obj)...)
		celErrs, _ := c.cel.Validate(context.Background(), nil, c.structural, obj, nil, celconfig.RuntimeCELCostBudget)
		return append(errs, celErrs...)
	}
	correlated := common.NewCorrelatedObject(obj, oldObj, &model.Structural{Structural: c.structural})
	errs := apiservervalidation.ValidateCustomResourceUpdate(nil, obj, oldObj, c.schema, apiservervalidation.WithRatcheting(correlated))
	errs = append(errs, structurallisttype.ValidateListSetsAndMaps(nil, c.structural, obj)...)
	celErrs, _ := c.cel.Validate(context.Background(), nil, c.structural, obj, oldObj, celconfig.RuntimeCELCostBudget, cel.WithRatcheting(correlated))
	return append(errs, celErrs...)
}

// asJSON is v as the apiserver's JSON decoder gives it (int64 numbers).
func asJSON(t testing.TB, v any) map[string]any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]any{}
	if err := utiljson.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// defaultedByCRD decodes raw into T after the CRD's structural defaulting.
func defaultedByCRD[T any](t *testing.T, c *crd, raw string) *T {
	t.Helper()
	m := map[string]any{}
	if err := utiljson.Unmarshal([]byte(raw), &m); err != nil {
		t.Fatal(err)
	}
	structuraldefaulting.Default(m, c.structural)
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	out := new(T)
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatal(err)
	}
	return out
}

func decode[T any](t *testing.T, raw string) *T {
	t.Helper()
	out := new(T)
	if err := json.Unmarshal([]byte(raw), out); err != nil {
		t.Fatal(err)
	}
	return out
}

// agree fails t when Go's checks and the CRD's disagree on whether an
// object is valid, or when Go words an error otherwise than the CRD: a
// client sees the same refusal from either backend. (Where JSON omits a
// zero field, the CRD's rules that read it fail with "no such key"
// instead; the apiserver defaults such a field first.)
func agree(t *testing.T, what string, goErrs, crdErrs field.ErrorList) {
	t.Helper()
	if (len(goErrs) == 0) != (len(crdErrs) == 0) {
		t.Errorf("%s: Go says %v, the CRD says %v", what, goErrs, crdErrs)
		return
	}
	crdSays := map[string]bool{}
	for _, err := range crdErrs {
		if strings.Contains(err.Error(), "no such key") {
			return
		}
		crdSays[err.Error()] = true
	}
	for _, err := range goErrs {
		if !crdSays[err.Error()] {
			t.Errorf("%s: Go says %q, the CRD %v", what, err.Error(), crdErrs)
		}
	}
}

var _ = cmp.Diff
