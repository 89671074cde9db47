package cli

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"syscall"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kubelock/kubelock/pkg/lock"
)

// Exit codes of kubelock, explained in exitCodesHelp (`kubelock --help`);
// most follow sysexits.h. `run` exits with its command's own code when the
// command ends by itself (128+N when a signal N ended it), so a command's own
// codes can collide with these; the lock-lost code is the one to watch for.
// An answer of the apiserver is never a usage error.
const (
	ExitOK                   = 0
	ExitError                = 1
	ExitUsage                = 64 // EX_USAGE, checked before anything is sent
	ExitNotFound             = 66 // EX_NOINPUT
	ExitUnreachable          = 69 // EX_UNAVAILABLE
	ExitNotAcquired          = 73 // EX_CANTCREAT
	ExitLockLost             = 75 // EX_TEMPFAIL
	ExitDenied               = 77 // EX_NOPERM: RBAC or authentication (401/403), admission (403) or the CRD's validation (422)
	ExitCommandNotExecutable = 126
	ExitCommandNotFound      = 127
)

// exitCodesHelp is the table shown in `kubelock --help`.
var exitCodesHelp = fmt.Sprintf(`Exit codes:
  %3d  ok (run: the command's own exit code, 128+N if signal N ended it)
  %3d  other error
  %3d  usage: bad flags or arguments (invalid key, lease or --wait out of bounds,
       --shared on a Mutex), no usable kubeconfig
  %3d  lock or lease not found
  %3d  apiserver unreachable or unavailable
  %3d  could not acquire: held by another holder, wait timed out, queue full, or
       the lock object too large for the apiserver's store
  %3d  lock lost while held (run: the command was stopped)
  %3d  denied by the apiserver: RBAC, admission (a [kubelock:<rule>] message) or
       the lock's validation rules (e.g. a lease above the lock's maximum)
  %3d  run: command not executable
  %3d  run: command not found`,
	ExitOK, ExitError, ExitUsage, ExitNotFound, ExitUnreachable, ExitNotAcquired,
	ExitLockLost, ExitDenied, ExitCommandNotExecutable, ExitCommandNotFound)

// exitError carries an exit code, and a message unless it is silent.
type exitError struct {
	code int
	err  error // nil: exit silently with code
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// withCode gives err an explicit exit code.
func withCode(code int, err error) error { return &exitError{code: code, err: err} }

// errorf is an error the CLI creates, with the "kubelock: " prefix that
// pkg/lock's errors carry too: every error reaches stderr as it is.
func errorf(format string, args ...any) error { return fmt.Errorf("kubelock: "+format, args...) }

// usageErrorf is a usage error (ExitUsage).
func usageErrorf(format string, args ...any) error {
	return withCode(ExitUsage, errorf(format, args...))
}

// exitCode maps an error to the documented exit code.
func exitCode(err error) int {
	var ee *exitError
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &ee):
		return ee.code
	case errors.Is(err, lock.ErrLockLost):
		return ExitLockLost
	case errors.Is(err, lock.ErrLocked), errors.Is(err, lock.ErrTimeout), errors.Is(err, lock.ErrQueueFull), errors.Is(err, lock.ErrTooLarge):
		return ExitNotAcquired
	case errors.Is(err, lock.ErrMode):
		// A mode the lock's type lacks (--shared on a Mutex): the flags' fault.
		return ExitUsage
	case errors.Is(err, lock.ErrNotFound), apierrors.IsNotFound(err):
		return ExitNotFound
	case denied(err):
		return ExitDenied
	case clientcmd.IsConfigurationInvalid(err), clientcmd.IsEmptyConfig(err):
		return ExitUsage
	case unreachable(err):
		return ExitUnreachable
	}
	return ExitError
}

// denied reports answers of the apiserver that refuse the request as it was
// sent: authentication, authorization, admission and the CRD's validation.
func denied(err error) bool {
	return apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) || apierrors.IsInvalid(err)
}

// unreachable reports errors that mean no apiserver answered, or it answered
// that it cannot serve now.
func unreachable(err error) bool {
	if apierrors.IsServiceUnavailable(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) {
		return true
	}
	var urlErr *url.Error
	var netErr net.Error
	var opErr *net.OpError
	var dnsErr *net.DNSError
	return errors.As(err, &urlErr) || errors.As(err, &netErr) || errors.As(err, &opErr) || errors.As(err, &dnsErr) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EHOSTUNREACH)
}

// notFound restates pkg/lock's ErrNotFound in the CLI's terms (its own text
// names the Go option WithAutoCreate); other errors pass unchanged.
func notFound(err error, ns, key string, canCreate bool) error {
	if !errors.Is(err, lock.ErrNotFound) {
		return err
	}
	name, _ := lock.NameForKey(key)
	hint := ""
	if canCreate {
		hint = "; an administrator creates it, or pass --create to create it on first use"
	}
	if name == key {
		return fmt.Errorf("%w: %s/%s%s", lock.ErrNotFound, ns, name, hint)
	}
	return fmt.Errorf("%w: %s/%s (key %q)%s", lock.ErrNotFound, ns, name, key, hint)
}

// oneLine is err as a single line for stderr: newlines folded, control
// characters escaped (errors quote identities and messages from the lock).
func oneLine(err error) string {
	return shown(strings.Join(strings.Fields(err.Error()), " "))
}
