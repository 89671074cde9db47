package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

const (
	group   = "locks.kubelock.io"
	version = "v1alpha1"

	// APIServiceName is the APIService by which kube-apiserver serves this
	// group version (its name is always version.group): its own (no Service)
	// for the CRDs, kubelock-apiserver's Service on the lock apiserver backend.
	APIServiceName = version + "." + group
)

var (
	// GroupVersion is the group and version of every type in this package.
	GroupVersion = schema.GroupVersion{Group: group, Version: version}

	// SchemeBuilder registers the types of this package with a runtime.Scheme.
	// It comes from apimachinery rather than controller-runtime so that importing
	// the API (as pkg/lock's users do) pulls in no controller machinery.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the types of this package to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &DistributedLock{}, &DistributedLockList{}, &LockSession{}, &LockSessionList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
