package registry

import (
	"context"

	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/registry/generic"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"
	"k8s.io/apiserver/pkg/registry/rest"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"
)

// Strategy is a resource's create, update and delete behaviour on its main endpoint.
type Strategy interface {
	rest.RESTCreateStrategy
	rest.RESTUpdateStrategy
	rest.RESTDeleteStrategy
	rest.ResetFieldsStrategy
}

// StatusStrategy is a resource's update behaviour on /status.
type StatusStrategy interface {
	rest.RESTUpdateStrategy
	rest.ResetFieldsStrategy
}

// Resource describes one kind of the lock API and its rules.
type Resource[T runtime.Object] struct {
	GroupResource  schema.GroupResource
	New, NewList   func() runtime.Object
	Strategy       Strategy
	StatusStrategy StatusStrategy
	// The rules of each write, run where admission runs.
	Create, Delete       func(context.Context, T) error
	Update, StatusUpdate func(ctx context.Context, newObj, oldObj T) error
}

// REST is a resource's main endpoint: create, get, list, watch, update,
// patch, delete.
type REST struct {
	*genericregistry.Store
	*Names
	create, remove func(rest.ValidateObjectFunc) rest.ValidateObjectFunc
	update         func(rest.ValidateObjectUpdateFunc) rest.ValidateObjectUpdateFunc
}

// StatusREST is a resource's status subresource: get, update, patch.
type StatusREST struct {
	store  *genericregistry.Store
	update func(rest.ValidateObjectUpdateFunc) rest.ValidateObjectUpdateFunc
}

// NewStorage builds r's two endpoints on the storage optsGetter configures.
func NewStorage[T runtime.Object](optsGetter generic.RESTOptionsGetter, r Resource[T]) (*REST, *StatusREST, error) {
	n, err := NamesFromCRD(r.GroupResource.Resource)
	if err != nil {
		return nil, nil, err
	}
	store := &genericregistry.Store{
		NewFunc:                   r.New,
		NewListFunc:               r.NewList,
		PredicateFunc:             Match,
		DefaultQualifiedResource:  r.GroupResource,
		SingularQualifiedResource: schema.GroupResource{Group: r.GroupResource.Group, Resource: n.Singular},
		CreateStrategy:            r.Strategy,
		UpdateStrategy:            r.Strategy,
		DeleteStrategy:            r.Strategy,
		ResetFieldsStrategy:       r.Strategy,
		TableConvertor:            n.Table,
	}
	if err := store.CompleteWithOptions(&generic.StoreOptions{RESTOptions: optsGetter, AttrFunc: Attrs}); err != nil {
		return nil, nil, err
	}
	status := *store
	status.UpdateStrategy = r.StatusStrategy
	status.ResetFieldsStrategy = r.StatusStrategy
	main := &REST{Store: store, Names: n,
		create: func(next rest.ValidateObjectFunc) rest.ValidateObjectFunc { return CheckObject(r.Create, next) },
		remove: func(next rest.ValidateObjectFunc) rest.ValidateObjectFunc { return CheckObject(r.Delete, next) },
		update: func(next rest.ValidateObjectUpdateFunc) rest.ValidateObjectUpdateFunc {
			return CheckUpdate(r.Update, next)
		},
	}
	return main, &StatusREST{store: &status,
		update: func(next rest.ValidateObjectUpdateFunc) rest.ValidateObjectUpdateFunc {
			return CheckUpdate(r.StatusUpdate, next)
		},
	}, nil
}

// Create applies the create rules.
func (r *REST) Create(ctx context.Context, obj runtime.Object, createValidation rest.ValidateObjectFunc, options *metav1.CreateOptions) (runtime.Object, error) {
	return r.Store.Create(ctx, obj, r.create(createValidation), options)
}

// Update applies the update rules, and the create rules to a server-side
// apply that creates.
func (r *REST) Update(ctx context.Context, name string, objInfo rest.UpdatedObjectInfo, createValidation rest.ValidateObjectFunc, updateValidation rest.ValidateObjectUpdateFunc, forceAllowCreate bool, options *metav1.UpdateOptions) (runtime.Object, bool, error) {
	return r.Store.Update(ctx, name, objInfo, r.create(createValidation), r.update(updateValidation), forceAllowCreate, options)
}

// Delete applies the delete rules.
func (r *REST) Delete(ctx context.Context, name string, deleteValidation rest.ValidateObjectFunc, options *metav1.DeleteOptions) (runtime.Object, bool, error) {
	return r.Store.Delete(ctx, name, r.remove(deleteValidation), options)
}

// DeleteCollection applies the delete rules to each object.
func (r *REST) DeleteCollection(ctx context.Context, deleteValidation rest.ValidateObjectFunc, options *metav1.DeleteOptions, listOptions *metainternalversion.ListOptions) (runtime.Object, error) {
	return r.Store.DeleteCollection(ctx, r.remove(deleteValidation), options, listOptions)
}

// New is an empty object.
func (r *StatusREST) New() runtime.Object { return r.store.New() }

// Destroy leaves the shared storage to the main endpoint.
func (r *StatusREST) Destroy() {}

// Get reads the object (a patch reads it first).
func (r *StatusREST) Get(ctx context.Context, name string, options *metav1.GetOptions) (runtime.Object, error) {
	return r.store.Get(ctx, name, options)
}

// Update writes status under the status rules; it never creates.
func (r *StatusREST) Update(ctx context.Context, name string, objInfo rest.UpdatedObjectInfo, createValidation rest.ValidateObjectFunc, updateValidation rest.ValidateObjectUpdateFunc, _ bool, options *metav1.UpdateOptions) (runtime.Object, bool, error) {
	return r.store.Update(ctx, name, objInfo, createValidation, r.update(updateValidation), false, options)
}

// GetResetFields implements rest.ResetFieldsStrategy.
func (r *StatusREST) GetResetFields() map[fieldpath.APIVersion]*fieldpath.Set {
	return r.store.GetResetFields()
}

// ConvertToTable prints the object's columns.
func (r *StatusREST) ConvertToTable(ctx context.Context, object runtime.Object, tableOptions runtime.Object) (*metav1.Table, error) {
	return r.store.ConvertToTable(ctx, object, tableOptions)
}
