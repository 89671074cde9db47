package lock

import (
	"context"
	"sync"
)

// slots serialises the goroutines of one process that want the same lock, so
// they share one place in the lock's queue instead of each taking one.
type slots struct {
	mu sync.Mutex
	m  map[string]*slot
}

type slot struct {
	ch   chan struct{}
	refs int
}

// take waits for the slot of name, or fails at once when wait is false.
func (s *slots) take(ctx context.Context, name string, wait bool) bool {
	s.mu.Lock()
	sl, ok := s.m[name]
	if !ok {
		sl = &slot{ch: make(chan struct{}, 1)}
		s.m[name] = sl
	}
	sl.refs++
	s.mu.Unlock()

	if !wait {
		select {
		case sl.ch <- struct{}{}:
			return true
		default:
		}
	} else {
		select {
		case sl.ch <- struct{}{}:
			return true
		case <-ctx.Done():
		}
	}
	s.drop(name, sl)
	return false
}

// give returns the slot of name taken with take.
func (s *slots) give(name string) {
	s.mu.Lock()
	sl := s.m[name]
	s.mu.Unlock()
	<-sl.ch
	s.drop(name, sl)
}

func (s *slots) drop(name string, sl *slot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sl.refs--; sl.refs == 0 {
		delete(s.m, name)
	}
}
