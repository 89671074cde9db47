// Package lockrules runs kubelock's admission rules inside the lock
// apiserver: the same pure rule functions the webhook calls, with the
// requester taken from the request context and each verb the rules ask about
// (force-release, update) answered by the server's delegated authorizer.
// A denial is a 403 whose message carries the rule's [kubelock:<rule>] tag,
// as the webhook's is.
package lockrules

import (
	"context"
	"errors"
	"fmt"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/rules"
)

// The resources the rules guard.
var (
	Locks    = locksv1alpha1.GroupVersion.WithResource("distributedlocks").GroupResource()
	Sessions = locksv1alpha1.GroupVersion.WithResource(locksv1alpha1.LockSessionsResource).GroupResource()
)

// SessionReader reads a LockSession from the lock store; nil, nil when it
// does not exist.
type SessionReader func(ctx context.Context, namespace, name string) (*locksv1alpha1.LockSession, error)

// Checker applies the rules to one write at a time.
type Checker struct {
	authz       authorizer.Authorizer
	controllers map[string]bool
	sessions    SessionReader
}

// New is a Checker that asks authz about verbs and treats controllerUsers
// as the controller (who expires holdings and drops waiters).
func New(authz authorizer.Authorizer, controllerUsers []string) (*Checker, error) {
	if len(controllerUsers) == 0 {
		return nil, errors.New("lockrules: at least one controller user name is required")
	}
	c := &Checker{authz: authz, controllers: map[string]bool{}}
	for _, u := range controllerUsers {
		c.controllers[u] = true
	}
	return c, nil
}

// ReadSessionsWith sets where the lock rules read the sessions a write names.
func (c *Checker) ReadSessionsWith(r SessionReader) { c.sessions = r }

// LockCreate checks creating l: lock users create only default locks.
func (c *Checker) LockCreate(ctx context.Context, l *locksv1alpha1.DistributedLock) error {
	a, err := c.requester(ctx)
	if err != nil {
		return err
	}
	return verdict(Locks, l.Name, rules.ValidateCreate(l, a))
}

// LockUpdate checks an update of a lock's main resource: its finalizers, the
// force-delete annotation and the auto-created label. Other spec and label
// edits are RBAC's alone.
func (c *Checker) LockUpdate(ctx context.Context, newObj, oldObj *locksv1alpha1.DistributedLock) error {
	if !rules.MetadataChanged(oldObj, newObj) {
		return nil
	}
	a, err := c.requester(ctx)
	if err != nil {
		return err
	}
	return verdict(Locks, oldObj.Name, rules.ValidateMetadataUpdate(oldObj, newObj, a))
}

// LockStatusUpdate checks a write of a lock's status: every transition rule,
// and the sessions the write names.
func (c *Checker) LockStatusUpdate(ctx context.Context, newObj, oldObj *locksv1alpha1.DistributedLock) error {
	a, err := c.requester(ctx)
	if err != nil {
		return err
	}
	sessions := map[string]*locksv1alpha1.LockSession{}
	for _, name := range rules.SessionsNamed(oldObj, newObj) {
		s, err := c.sessions(ctx, oldObj.Namespace, name)
		if err != nil {
			return apierrors.NewInternalError(fmt.Errorf("reading session %s: %w", name, err))
		}
		if s != nil {
			sessions[name] = s
		}
	}
	errs := append(rules.ValidateStatusUpdate(oldObj, newObj, a), rules.ValidateSessionRefs(oldObj, newObj, a, sessions)...)
	return verdict(Locks, oldObj.Name, errs)
}

// LockDelete checks deleting l: a held lock only with force.
func (c *Checker) LockDelete(ctx context.Context, l *locksv1alpha1.DistributedLock) error {
	a, err := c.requester(ctx)
	if err != nil {
		return err
	}
	return verdict(Locks, l.Name, rules.ValidateDelete(l, a))
}

// SessionCreate checks creating s: in the requester's name, bound to its pod.
func (c *Checker) SessionCreate(ctx context.Context, s *locksv1alpha1.LockSession) error {
	a, err := c.requester(ctx)
	if err != nil {
		return err
	}
	return verdict(Sessions, s.Name, rules.ValidateSessionCreate(s, a))
}

// SessionUpdate checks an update of a session's main resource.
func (c *Checker) SessionUpdate(ctx context.Context, newObj, oldObj *locksv1alpha1.LockSession) error {
	a, err := c.requester(ctx)
	if err != nil {
		return err
	}
	return verdict(Sessions, oldObj.Name, rules.ValidateSessionUpdate(oldObj, newObj, a))
}

// SessionStatusUpdate checks a write of a session's status.
func (c *Checker) SessionStatusUpdate(ctx context.Context, newObj, oldObj *locksv1alpha1.LockSession) error {
	a, err := c.requester(ctx)
	if err != nil {
		return err
	}
	return verdict(Sessions, oldObj.Name, rules.ValidateSessionStatus(oldObj, newObj, a))
}

// SessionDelete checks closing s.
func (c *Checker) SessionDelete(ctx context.Context, s *locksv1alpha1.LockSession) error {
	a, err := c.requester(ctx)
	if err != nil {
		return err
	}
	return verdict(Sessions, s.Name, rules.ValidateSessionDelete(s, a))
}

// requester is the request's user as the rules see it, with the verbs they
// ask about answered by the delegated authorizer.
func (c *Checker) requester(ctx context.Context) (rules.Actor, error) {
	u, ok := genericapirequest.UserFrom(ctx)
	if !ok {
		return rules.Actor{}, apierrors.NewInternalError(errors.New("no user in the request context"))
	}
	return rules.Actor{
		Username: u.GetName(), Groups: u.GetGroups(), Extra: u.GetExtra(),
		IsController:       c.controllers[u.GetName()],
		IsGarbageCollector: slices.Contains(rules.DefaultGarbageCollectors, u.GetName()),
		Authorizer:         rules.AuthorizerFunc(func(chk rules.Check) (bool, error) { return c.can(ctx, u, chk) }),
	}, nil
}

// can asks the authorizer whether u may use chk's verb.
func (c *Checker) can(ctx context.Context, u user.Info, chk rules.Check) (bool, error) {
	d, _, err := c.authz.Authorize(ctx, authorizer.AttributesRecord{
		User: u, Verb: chk.Verb, Namespace: chk.Namespace, Name: chk.Name, ResourceRequest: true,
		APIGroup: locksv1alpha1.GroupVersion.Group, APIVersion: locksv1alpha1.GroupVersion.Version, Resource: chk.Resource,
	})
	if d == authorizer.DecisionAllow {
		return true, nil
	}
	return false, err
}

// verdict is nil when errs is empty; a 500 when a check could not be made
// (rules.Failed); else a 403 listing every rule's denial.
func verdict(gr schema.GroupResource, name string, errs field.ErrorList) error {
	switch {
	case len(errs) == 0:
		return nil
	case rules.Failed(errs):
		return apierrors.NewInternalError(errs.ToAggregate())
	}
	return apierrors.NewForbidden(gr, name, errs.ToAggregate())
}
