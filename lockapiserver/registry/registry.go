// Package registry holds what the lock apiserver's two stores share: the
// names and printer columns they take from the generated CRDs (so the API
// reads the same as the CRD backend's), their selectors, and the hooks that
// run kubelock's rules where the apiserver runs admission.
package registry

import (
	"context"
	"fmt"
	"io/fs"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/registry/customresource/tableconvertor"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/registry/rest"
	"k8s.io/apiserver/pkg/storage"
	"sigs.k8s.io/yaml"

	"github.com/kubelock/kubelock/config"
)

// Names are a resource's names and printer columns as its CRD declares them.
type Names struct {
	Singular   string
	shortNames []string
	categories []string
	Table      rest.TableConvertor
}

// ShortNames implements rest.ShortNamesProvider.
func (n *Names) ShortNames() []string { return n.shortNames }

// Categories implements rest.CategoriesProvider.
func (n *Names) Categories() []string { return n.categories }

// NamesFromCRD reads the generated CRD of plural (e.g. "distributedlocks")
// that the binary embeds.
func NamesFromCRD(plural string) (*Names, error) {
	path := "crd/bases/locks.kubelock.io_" + plural + ".yaml"
	b, err := fs.ReadFile(config.FS, path)
	if err != nil {
		return nil, err
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(b, crd); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(crd.Spec.Versions) != 1 {
		return nil, fmt.Errorf("%s: want one version, not %d", path, len(crd.Spec.Versions))
	}
	table, err := tableconvertor.New(crd.Spec.Versions[0].AdditionalPrinterColumns)
	if err != nil {
		return nil, fmt.Errorf("%s: printer columns: %w", path, err)
	}
	return &Names{Singular: crd.Spec.Names.Singular, shortNames: crd.Spec.Names.ShortNames, categories: crd.Spec.Names.Categories, Table: table}, nil
}

// Attrs are an object's labels and the fields it can be selected by:
// metadata.name and metadata.namespace, as for any custom resource.
func Attrs(obj runtime.Object) (labels.Set, fields.Set, error) {
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil, nil, err
	}
	return m.GetLabels(), fields.Set{"metadata.name": m.GetName(), "metadata.namespace": m.GetNamespace()}, nil
}

// Match is the store's predicate for label and field selectors.
func Match(label labels.Selector, field fields.Selector) storage.SelectionPredicate {
	return storage.SelectionPredicate{Label: label, Field: field, GetAttrs: Attrs}
}

// The hooks below run a rule check where the apiserver runs validating
// admission (inside the store's compare-and-swap loop, on the object as it
// will be stored and the one stored now), then next, admission's own.

// CheckObject runs check on the object a create makes or a delete removes, before next.
func CheckObject[T runtime.Object](check func(context.Context, T) error, next rest.ValidateObjectFunc) rest.ValidateObjectFunc {
	return func(ctx context.Context, obj runtime.Object) error {
		t, err := as[T](obj)
		if err == nil {
			err = check(ctx, t)
		}
		if err != nil || next == nil {
			return err
		}
		return next(ctx, obj)
	}
}

// CheckUpdate runs check on an update, new object first, before next.
func CheckUpdate[T runtime.Object](check func(ctx context.Context, newObj, oldObj T) error, next rest.ValidateObjectUpdateFunc) rest.ValidateObjectUpdateFunc {
	return func(ctx context.Context, obj, old runtime.Object) error {
		n, err := as[T](obj)
		var o T
		if err == nil {
			o, err = as[T](old)
		}
		if err == nil {
			err = check(ctx, n, o)
		}
		if err != nil || next == nil {
			return err
		}
		return next(ctx, obj, old)
	}
}

func as[T runtime.Object](obj runtime.Object) (T, error) {
	t, ok := obj.(T)
	if !ok {
		return t, apierrors.NewInternalError(fmt.Errorf("unexpected object of type %T", obj))
	}
	return t, nil
}
