// Package proc runs the child processes of kubelock's local tools and suites
// (kubelock-dev, the benchmark, the fault-injection suite): each in a process
// group of its own with its output in a log file, stopped group-wide, and
// awaited with a readiness check.
package proc

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// Child is a started process: in a process group of its own, so a terminal's
// Ctrl-C reaches only its parent, which then stops it in order; on Linux it
// also gets SIGKILL when its parent dies (see procattr_linux.go).
type Child struct {
	// Name names the process in errors.
	Name string
	// LogPath is where its stdout and stderr go.
	LogPath string
	cmd     *exec.Cmd
	done    chan struct{} // closed when the process exited
	err     error         // its Wait result, once done is closed
}

// Start starts path with args, its output in logPath.
func Start(name, path, logPath string, args ...string) (*Child, error) {
	return StartCmd(name, exec.Command(path, args...), logPath)
}

// StartCmd starts cmd, which may set its environment, stdin and stdout; what
// it leaves unconnected goes to logPath, appended after a line that says when
// it started, so the runs of a process restarted with the same log are told apart.
func StartCmd(name string, cmd *exec.Cmd, logPath string) (*Child, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(logf, "==== start %s %v\n", time.Now().Format(time.RFC3339Nano), cmd.Args[1:])
	if cmd.Stdout == nil {
		cmd.Stdout = logf
	}
	if cmd.Stderr == nil {
		cmd.Stderr = logf
	}
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	c := &Child{Name: name, cmd: cmd, LogPath: logPath, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		_ = logf.Close()
		close(c.done)
	}()
	return c, nil
}

// Pid is the process's ID (and its process group's).
func (c *Child) Pid() int { return c.cmd.Process.Pid }

// Done is closed when the process has exited.
func (c *Child) Done() <-chan struct{} { return c.done }

// Exited returns an error describing the process's end when it has ended.
func (c *Child) Exited() error {
	select {
	case <-c.done:
		return fmt.Errorf("%s exited (%w); last log line: %s (log: %s)", c.Name, c.err, LastLine(c.LogPath), c.LogPath)
	default:
		return nil
	}
}

// Signal sends sig to the process alone.
func (c *Child) Signal(sig os.Signal) error { return c.cmd.Process.Signal(sig) }

// Stop sends SIGTERM to the process group and waits for the process; after
// grace it kills the group. A paused (SIGSTOPped) group is continued, so that
// it can act on the SIGTERM.
func (c *Child) Stop(grace time.Duration) error {
	select {
	case <-c.done:
		return nil
	default:
	}
	pgid := c.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	_ = syscall.Kill(-pgid, syscall.SIGCONT)
	select {
	case <-c.done:
	case <-time.After(grace):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-c.done
		return fmt.Errorf("%s did not stop within %s after SIGTERM; killed it", c.Name, grace)
	}
	// Anything it started itself (etcd and kube-apiserver start nothing) goes too.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	return nil
}

// WaitFor polls check until it succeeds, the process exits, or timeout or
// ctx ends; each check gets at most 5 s.
func (c *Child) WaitFor(ctx context.Context, what string, timeout time.Duration, check func(context.Context) error) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		if err := c.Exited(); err != nil {
			return false, err
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		last = check(cctx)
		return last == nil, nil
	})
	if wait.Interrupted(err) && ctx.Err() == nil {
		return fmt.Errorf("%s not %s after %s: %w (log: %s)", c.Name, what, timeout, last, c.LogPath)
	}
	return err
}

// LastLine is the last non-empty line of a log file, for error messages.
func LastLine(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return "-"
	}
	lines := bytes.Split(bytes.TrimSpace(data), []byte("\n"))
	if len(lines) == 0 || len(lines[len(lines)-1]) == 0 {
		return "-"
	}
	l := strings.TrimSpace(string(lines[len(lines)-1]))
	if len(l) > 300 {
		l = l[:300] + "…"
	}
	return l
}
