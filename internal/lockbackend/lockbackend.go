// Package lockbackend says which backend serves the lock API
// (locks.kubelock.io/v1alpha1) in a cluster, and refuses to switch to the
// other one while it is installed. A group version is served by a CRD or by
// an APIService, never both, and each backend's fencing tokens come from its
// own etcd's revisions: a lock carried across could get a lower token than
// it had, so nothing carries one across. kubelock-apiserver checks at start
// (and has a check-backend command for installers); kubelock-dev checks
// before it installs either backend.
package lockbackend

import (
	"context"
	"fmt"
	"strings"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// Backend is where the lock API is served from.
type Backend string

const (
	// CRD is the lock CRDs in the cluster's apiserver and etcd.
	CRD Backend = "crd"
	// APIServer is kubelock-apiserver behind an APIService, with an etcd of its own.
	APIServer Backend = "apiserver"
)

// Parse reads a backend's name.
func Parse(name string) (Backend, error) {
	switch b := Backend(name); b {
	case CRD, APIServer:
		return b, nil
	}
	return "", fmt.Errorf("a backend is %q or %q, not %q", CRD, APIServer, name)
}

// other is the backend b switches from.
func (b Backend) other() Backend {
	if b == CRD {
		return APIServer
	}
	return CRD
}

// APIServiceName is the lock API's APIService: kube-apiserver's own for the
// CRD backend (no service), the lock apiserver's otherwise.
const APIServiceName = locksv1alpha1.APIServiceName

// CRDNames are the lock CRDs.
var CRDNames = []string{"distributedlocks." + locksv1alpha1.GroupVersion.Group, "locksessions." + locksv1alpha1.GroupVersion.Group}

// CheckRules are the RBAC rules Check needs.
var CheckRules = []rbacv1.PolicyRule{
	{APIGroups: []string{"apiextensions.k8s.io"}, Resources: []string{"customresourcedefinitions"}, ResourceNames: CRDNames, Verbs: []string{"get"}},
	{APIGroups: []string{"apiregistration.k8s.io"}, Resources: []string{"apiservices"}, ResourceNames: []string{APIServiceName}, Verbs: []string{"get"}},
	{APIGroups: []string{locksv1alpha1.GroupVersion.Group}, Resources: []string{"distributedlocks", "locksessions"}, Verbs: []string{"list"}},
}

// installation is how a backend is installed: what serves the API, and the
// command that removes it.
type installation struct {
	what, remove string
}

// Check returns nil when nothing but to serves the lock API through c (an
// administrator's client of kube-apiserver), and a *SwitchRefusedError
// otherwise, also when the other backend's locks cannot be counted: the
// switch is refused while the other backend is installed (a group version
// is served by one), and the error says how many locks it holds.
func Check(ctx context.Context, c client.Client, to Backend) error {
	from := to.other()
	inst, err := installed(ctx, c, from)
	if err != nil {
		return fmt.Errorf("cannot tell whether the %s backend serves the lock API: %w", from, err)
	}
	if inst == nil {
		return nil
	}
	refused := &SwitchRefusedError{To: to, From: from, What: inst.what, Remove: inst.remove}
	refused.Locks, refused.Sessions, refused.CountErr = countLocks(ctx, c)
	return refused
}

// installed is how b is installed, nil when it is not.
func installed(ctx context.Context, c client.Client, b Backend) (*installation, error) {
	if b == CRD {
		var names []string
		for _, name := range CRDNames {
			crd := &metav1.PartialObjectMetadata{}
			crd.SetGroupVersionKind(schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"})
			switch err := c.Get(ctx, client.ObjectKey{Name: name}, crd); {
			case apierrors.IsNotFound(err):
			case err != nil:
				return nil, err
			default:
				names = append(names, name)
			}
		}
		if len(names) == 0 {
			return nil, nil
		}
		return &installation{what: "CRDs " + strings.Join(names, ", "), remove: "kubectl delete crd " + strings.Join(names, " ")}, nil
	}
	as := &unstructured.Unstructured{}
	as.SetAPIVersion("apiregistration.k8s.io/v1")
	as.SetKind("APIService")
	switch err := c.Get(ctx, client.ObjectKey{Name: APIServiceName}, as); {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, err
	}
	// Without a service it is kube-apiserver's own, for a CRD.
	ns, _, _ := unstructured.NestedString(as.Object, "spec", "service", "namespace")
	name, _, _ := unstructured.NestedString(as.Object, "spec", "service", "name")
	if name == "" {
		return nil, nil
	}
	return &installation{what: fmt.Sprintf("APIService %s, Service %s/%s", APIServiceName, ns, name), remove: "kubectl delete apiservice " + APIServiceName}, nil
}

// countLocks counts the DistributedLocks and LockSessions the lock API
// serves, in every namespace.
func countLocks(ctx context.Context, c client.Client) (locks, sessions int, err error) {
	if locks, err = count(ctx, c, "DistributedLockList"); err != nil {
		return 0, 0, err
	}
	sessions, err = count(ctx, c, "LockSessionList")
	return locks, sessions, err
}

func count(ctx context.Context, c client.Client, kind string) (int, error) {
	n, page := 0, &metav1.PartialObjectMetadataList{}
	page.SetGroupVersionKind(locksv1alpha1.GroupVersion.WithKind(kind))
	for {
		if err := c.List(ctx, page, client.Limit(500), client.Continue(page.Continue)); err != nil {
			return 0, err
		}
		n += len(page.Items)
		if page.Continue == "" {
			return n, nil
		}
	}
}

// SwitchRefusedError says that the lock API cannot move to To while From
// serves it, and what to do.
type SwitchRefusedError struct {
	To, From Backend
	// What serves the API now, and Remove the command that removes it.
	What, Remove string
	// Locks and Sessions From holds, unless CountErr says why they could
	// not be counted.
	Locks, Sessions int
	CountErr        error
}

func (e *SwitchRefusedError) Error() string {
	var holds, then string
	switch {
	case e.CountErr != nil:
		holds = fmt.Sprintf("may hold locks (listing them failed: %v)", e.CountErr)
		then = "make it serve, release and delete its DistributedLocks and LockSessions, then remove it"
	case e.Locks+e.Sessions > 0:
		holds = fmt.Sprintf("holds %d DistributedLock(s) and %d LockSession(s)", e.Locks, e.Sessions)
		then = "release and delete them, then remove it"
	default:
		holds = "holds no locks"
		then = "remove it"
	}
	return fmt.Sprintf("refusing to serve %s from the %s backend: the %s backend serves it (%s) and %s; "+
		"each backend's fencing tokens come from its own etcd's revisions, so locks are never carried across, "+
		"which could give them lower tokens. Stay on the %s backend, or %s (%s) and switch",
		locksv1alpha1.GroupVersion, e.To, e.From, e.What, holds, e.From, then, e.Remove)
}
