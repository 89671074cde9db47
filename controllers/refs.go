package controllers

import (
	"strings"

	"github.com/google/uuid"
	apimachineryvalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
)

// An entry of a lock (a holding or a waiter) names what it depends on: a
// LockSession in the lock's namespace, or a pod in its service account's
// namespace. Clients write those names. Admission checks them, but an object
// written before it did, or straight into etcd, may carry anything, and a
// name such as "../../version" made into a read fails every time: it names
// nothing. So the controller reads, indexes or enqueues only a reference that
// can name an object, checked as the apiserver checks the names it gives
// (a DNS-1123 subdomain for a pod or a LockSession, a DNS-1123 label for a
// namespace, a canonical UUID for a UID). decide judges an entry whose
// reference cannot: docs/design.md, "References that name nothing".

// validSessionName reports whether name can be a LockSession's.
func validSessionName(name string) bool {
	return len(apimachineryvalidation.NameIsDNSSubdomain(name, false)) == 0
}

// validUID reports whether uid is one the apiserver gives: a canonical UUID.
func validUID(uid string) bool {
	u, err := uuid.Parse(uid)
	return err == nil && u.String() == uid
}

// podRef is a pod an entry without a session is bound to.
type podRef struct {
	key types.NamespacedName
	uid string
}

// podBinding says how an entry is bound to a pod.
type podBinding int

const (
	// notPodBound: no pod named, or one whose namespace is unknown because
	// the entry's user is no service account (every pod-bound token's is).
	notPodBound podBinding = iota
	// podBound: to the pod podOf returns.
	podBound
	// boundToNoPod: to a pod reference no pod can have.
	boundToNoPod
)

// podOf is the pod an entry of user with podName and podUID is bound to.
func podOf(user, podName, podUID string) (podRef, podBinding) {
	if podName == "" || podUID == "" || !strings.HasPrefix(user, serviceaccount.ServiceAccountUsernamePrefix) {
		return podRef{}, notPodBound
	}
	ns, _, err := serviceaccount.SplitUsername(user)
	if err != nil || len(apimachineryvalidation.NameIsDNSSubdomain(podName, false)) > 0 || !validUID(podUID) {
		return podRef{}, boundToNoPod
	}
	return podRef{key: types.NamespacedName{Namespace: ns, Name: podName}, uid: podUID}, podBound
}
