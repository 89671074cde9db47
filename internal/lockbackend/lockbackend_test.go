package lockbackend

import (
	"errors"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, name := range []string{"crd", "apiserver"} {
		if b, err := Parse(name); err != nil || string(b) != name {
			t.Errorf("Parse(%q) = %q, %v", name, b, err)
		}
	}
	if _, err := Parse("redis"); err == nil || err.Error() != `a backend is "crd" or "apiserver", not "redis"` {
		t.Errorf("Parse(redis) = %v", err)
	}
}

// The refusal says what serves the API, what it holds, and what to do: one
// line whether it holds locks, none, or could not count them.
func TestSwitchRefusedErrorSaysWhatToDo(t *testing.T) {
	base := SwitchRefusedError{To: CRD, From: APIServer, What: "APIService v1alpha1.locks.kubelock.io, Service ns/s", Remove: "kubectl delete apiservice v1alpha1.locks.kubelock.io"}
	for _, tc := range []struct {
		name         string
		edit         func(*SwitchRefusedError)
		holds, doing string
	}{
		{"holding locks", func(e *SwitchRefusedError) { e.Locks, e.Sessions = 2, 1 },
			"holds 2 DistributedLock(s) and 1 LockSession(s)", "release and delete them, then remove it"},
		{"holding none", func(*SwitchRefusedError) {}, "holds no locks", "or remove it ("},
		{"not answering", func(e *SwitchRefusedError) {
			e.CountErr = errors.New("the server is currently unable to handle the request")
		},
			"may hold locks (listing them failed: the server is currently unable to handle the request)", "make it serve, release and delete its DistributedLocks and LockSessions, then remove it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := base
			tc.edit(&e)
			msg := e.Error()
			for _, want := range []string{
				"refusing to serve locks.kubelock.io/v1alpha1 from the crd backend: the apiserver backend serves it (APIService v1alpha1.locks.kubelock.io, Service ns/s) and ",
				tc.holds, tc.doing, "Stay on the apiserver backend", "(kubectl delete apiservice v1alpha1.locks.kubelock.io) and switch",
			} {
				if !strings.Contains(msg, want) {
					t.Errorf("%q does not say %q", msg, want)
				}
			}
			if strings.Contains(msg, "\n") {
				t.Errorf("not one line: %q", msg)
			}
		})
	}
}
