// Package v1alpha1 contains the DistributedLock and LockSession API of the locks.kubelock.io group.
//
// The package markers live in this file because openapi-gen reads them only
// from a doc.go. Its model names (zz_generated.model_name.go) are how the
// lock apiserver's OpenAPI names the types and maps them to their kinds.
//
// +kubebuilder:object:generate=true
// +k8s:openapi-gen=true
// +k8s:openapi-model-package=io.kubelock.locks.v1alpha1
// +groupName=locks.kubelock.io
package v1alpha1
