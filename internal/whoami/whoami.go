// Package whoami learns the user a client authenticates as, the way
// `kubectl auth whoami` does: the lock client writes it into holdings and
// queue entries, where admission accepts no other name, and the controller
// as the endedBy of the holdings it ends. It imports nothing of kubelock: the
// client and the operator both use it.
package whoami

import (
	"context"
	"errors"
	"fmt"
	"sync"

	authenticationv1 "k8s.io/api/authentication/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Self is the user a client authenticates as, learned with one
// SelfSubjectReview on first use and remembered; a review that fails is asked
// again on the next call. It is safe for concurrent use.
type Self struct {
	c client.Client

	mu   sync.Mutex
	info *authenticationv1.UserInfo
}

// New returns the not yet learned user of c.
func New(c client.Client) *Self { return &Self{c: c} }

// UserInfo is the authenticated user: name, groups and extra (the pod a
// bound service-account token carries).
func (s *Self) UserInfo(ctx context.Context) (authenticationv1.UserInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.info == nil {
		review := &authenticationv1.SelfSubjectReview{}
		if err := s.c.Create(ctx, review); err != nil {
			return authenticationv1.UserInfo{}, fmt.Errorf("kubelock: learning the authenticated user with a SelfSubjectReview: %w", err)
		}
		if review.Status.UserInfo.Username == "" {
			return authenticationv1.UserInfo{}, errors.New("kubelock: the apiserver returned no user name in the SelfSubjectReview")
		}
		s.info = &review.Status.UserInfo
	}
	return *s.info, nil
}

// Username is the authenticated user's name.
func (s *Self) Username(ctx context.Context) (string, error) {
	info, err := s.UserInfo(ctx)
	return info.Username, err
}
