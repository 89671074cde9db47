// Package v1alpha1 contains the DistributedLock and LockSession API of the locks.kubelock.io group.
//
// The package markers live in this file because openapi-gen reads them only
// from a doc.go.
//
// +kubebuilder:object:generate=true
// +k8s:openapi-gen=true
// +groupName=locks.kubelock.io
package v1alpha1
