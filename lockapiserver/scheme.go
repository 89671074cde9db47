package lockapiserver

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/runtime/serializer/cbor"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/lockapiserver/validation"
)

var (
	// Scheme knows the lock API, its defaults, and what every API server needs.
	Scheme = runtime.NewScheme()
	// Codecs serve requests (JSON, YAML; CBOR when its feature gate is on).
	Codecs = serializer.NewCodecFactory(Scheme)
	// storageCodecs can also write CBOR, a storage encoding of its own.
	storageCodecs = serializer.NewCodecFactory(Scheme, serializer.WithSerializer(cbor.NewSerializerInfo))
)

func init() {
	utilruntime.Must(install(Scheme))
}

// install registers the v1alpha1 types twice: as v1alpha1, and as the
// group's internal version. An apiserver converts every request to its
// internal version; with the same Go types that is no conversion (the
// scheme only sets the kind), so an object is decoded once into the types
// clients use.
func install(s *runtime.Scheme) error {
	if err := locksv1alpha1.AddToScheme(s); err != nil {
		return err
	}
	internal := schema.GroupVersion{Group: locksv1alpha1.GroupVersion.Group, Version: runtime.APIVersionInternal}
	s.AddKnownTypes(internal, &locksv1alpha1.DistributedLock{}, &locksv1alpha1.DistributedLockList{},
		&locksv1alpha1.LockSession{}, &locksv1alpha1.LockSessionList{})
	// Every decode defaults, requests and reads from etcd alike, as the CRD's
	// defaults apply to both.
	s.AddTypeDefaultingFunc(&locksv1alpha1.DistributedLock{}, func(o any) {
		validation.SetLockDefaults(o.(*locksv1alpha1.DistributedLock)) //nolint:errcheck // registered for this type
	})
	s.AddTypeDefaultingFunc(&locksv1alpha1.LockSession{}, func(o any) {
		validation.SetSessionDefaults(o.(*locksv1alpha1.LockSession)) //nolint:errcheck // registered for this type
	})
	if err := s.SetVersionPriority(locksv1alpha1.GroupVersion); err != nil {
		return err
	}
	// The options and status types every API server serves.
	unversioned := schema.GroupVersion{Version: "v1"}
	metav1.AddToGroupVersion(s, unversioned)
	s.AddUnversionedTypes(unversioned, &metav1.Status{}, &metav1.APIVersions{}, &metav1.APIGroupList{}, &metav1.APIGroup{}, &metav1.APIResourceList{})
	return nil
}
