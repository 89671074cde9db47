package lock

import (
	"context"
	"fmt"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// reenter returns the client's live holding of name with its hold count
// raised, when it holds name in the mode asked for (ok, nil), or ErrMode when
// it holds it in the other mode (ok, error). ok is false when the client does
// not hold name. Callers pass the key's gate (WithReentrancy).
func (c *Client) reenter(name string, shared bool) (l *Lock, ok bool, err error) {
	c.heldMu.Lock()
	l = c.held[name]
	c.heldMu.Unlock()
	if l == nil {
		return nil, false, nil
	}
	want := shared || l.lockType == locksv1alpha1.Semaphore
	if want != l.shared {
		if !l.live() {
			return nil, false, nil // ended: a new acquisition in any mode
		}
		return nil, true, fmt.Errorf("%w: this client holds %s %s; release it before acquiring it %s",
			ErrMode, name, modeName(l.shared), modeName(want))
	}
	if !l.enter() {
		return nil, false, nil
	}
	return l, true, nil
}

// remember makes l the holding a re-entry of its lock returns, until it ends.
func (c *Client) remember(l *Lock) {
	c.heldMu.Lock()
	c.held[l.name] = l
	c.heldMu.Unlock()
	context.AfterFunc(l.ctx, func() {
		c.heldMu.Lock()
		defer c.heldMu.Unlock()
		if c.held[l.name] == l {
			delete(c.held, l.name)
		}
	})
}

func modeName(shared bool) string {
	if shared {
		return "shared"
	}
	return "exclusively"
}

// live reports whether the holding has not ended (its Context is not done).
func (l *Lock) live() bool { return l.ctx.Err() == nil }
