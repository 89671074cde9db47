package registry

import (
	"context"

	apimachineryvalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/storage/names"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// Kind is what the strategies need of one kind's objects: its CRD's checks
// (package validation) and access to its parts.
type Kind[T runtime.Object] struct {
	Validate       func(T) field.ErrorList
	ValidateUpdate func(newObj, oldObj T) field.ErrorList
	Meta           func(T) *metav1.ObjectMeta
	ClearStatus    func(T)
	// CopyStatus and CopySpec set newObj's part to a copy of oldObj's.
	CopyStatus, CopySpec func(newObj, oldObj T)
	SameSpec             func(newObj, oldObj T) bool
}

var metadataPath = field.NewPath("metadata")

// strategy is the main endpoint's: what a custom resource with a status
// subresource does (a write never changes status; the generation counts spec
// changes), and the CRD's checks.
type strategy[T runtime.Object] struct {
	runtime.ObjectTyper
	names.NameGenerator
	kind Kind[T]
}

// statusStrategy is the status subresource's: a write changes status alone.
type statusStrategy[T runtime.Object] struct{ strategy[T] }

// Strategies are the two strategies of kind k.
func Strategies[T runtime.Object](typer runtime.ObjectTyper, k Kind[T]) (Strategy, StatusStrategy) {
	s := strategy[T]{ObjectTyper: typer, NameGenerator: names.SimpleNameGenerator, kind: k}
	return s, statusStrategy[T]{s}
}

func (strategy[T]) NamespaceScoped() bool { return true }

// PrepareForCreate drops status: only status writes set it.
func (s strategy[T]) PrepareForCreate(_ context.Context, obj runtime.Object) {
	t := obj.(T) //nolint:errcheck // a store holds one kind
	s.kind.ClearStatus(t)
	s.kind.Meta(t).Generation = 1
}

// PrepareForUpdate keeps the stored status.
func (s strategy[T]) PrepareForUpdate(_ context.Context, obj, old runtime.Object) {
	n, o := obj.(T), old.(T) //nolint:errcheck // a store holds one kind
	s.kind.CopyStatus(n, o)
	if !s.kind.SameSpec(n, o) {
		s.kind.Meta(n).Generation = s.kind.Meta(o).Generation + 1
	}
}

// Validate checks the name as a custom resource's (a DNS subdomain) and the CRD's checks.
func (s strategy[T]) Validate(_ context.Context, obj runtime.Object) field.ErrorList {
	t := obj.(T) //nolint:errcheck // a store holds one kind
	errs := apimachineryvalidation.ValidateObjectMetaAccessor(s.kind.Meta(t), true, apimachineryvalidation.NameIsDNSSubdomain, metadataPath)
	return append(errs, s.kind.Validate(t)...)
}

func (s strategy[T]) ValidateUpdate(_ context.Context, obj, old runtime.Object) field.ErrorList {
	n, o := obj.(T), old.(T) //nolint:errcheck // a store holds one kind
	errs := apimachineryvalidation.ValidateObjectMetaAccessorUpdate(s.kind.Meta(n), s.kind.Meta(o), metadataPath)
	return append(errs, s.kind.ValidateUpdate(n, o)...)
}

func (strategy[T]) WarningsOnCreate(context.Context, runtime.Object) []string { return nil }
func (strategy[T]) WarningsOnUpdate(context.Context, runtime.Object, runtime.Object) []string {
	return nil
}
func (strategy[T]) Canonicalize(runtime.Object)                   {}
func (strategy[T]) AllowCreateOnUpdate(context.Context) bool      { return false }
func (strategy[T]) AllowUnconditionalUpdate(context.Context) bool { return false }

// GetResetFields: server-side apply never owns status through the main endpoint.
func (strategy[T]) GetResetFields() map[fieldpath.APIVersion]*fieldpath.Set {
	return resetFields("status")
}

// PrepareForUpdate keeps everything stored but status and managedFields
// (which the write's field manager has just updated), as a custom
// resource's status subresource does.
func (s statusStrategy[T]) PrepareForUpdate(_ context.Context, obj, old runtime.Object) {
	n, o := obj.(T), old.(T) //nolint:errcheck // a store holds one kind
	nm := s.kind.Meta(n)
	managed := nm.ManagedFields
	s.kind.Meta(o).DeepCopyInto(nm)
	nm.ManagedFields = managed
	s.kind.CopySpec(n, o)
}

// GetResetFields: server-side apply never owns spec through status.
func (statusStrategy[T]) GetResetFields() map[fieldpath.APIVersion]*fieldpath.Set {
	return resetFields("spec")
}

// resetFields names the top-level field a write through one endpoint never
// changes, so server-side apply records no owner of it there.
func resetFields(top string) map[fieldpath.APIVersion]*fieldpath.Set {
	return map[fieldpath.APIVersion]*fieldpath.Set{
		fieldpath.APIVersion(locksv1alpha1.GroupVersion.String()): fieldpath.NewSet(fieldpath.MakePathOrDie(top)),
	}
}
