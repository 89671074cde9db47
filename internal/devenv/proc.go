package devenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// child is a process kubelock dev started: in a process group of its own, so
// a terminal's Ctrl-C reaches only kubelock dev, which then stops it in order;
// on Linux it also gets SIGKILL when kubelock dev dies (see procattr_linux.go).
type child struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed when the process exited
	err     error         // its Wait result, once done is closed
}

func startChild(name, path, logPath string, args ...string) (*child, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		_ = logf.Close()
		close(c.done)
	}()
	return c, nil
}

// exited returns an error describing the process's end when it has ended.
func (c *child) exited() error {
	select {
	case <-c.done:
		return fmt.Errorf("%s exited (%w); last log line: %s (log: %s)", c.name, c.err, lastLine(c.logPath), c.logPath)
	default:
		return nil
	}
}

// stop sends SIGTERM to the process group and waits for the process; after
// grace it kills the group.
func (c *child) stop(grace time.Duration) error {
	select {
	case <-c.done:
		return nil
	default:
	}
	pgid := c.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(grace):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-c.done
		return fmt.Errorf("%s did not stop within %s after SIGTERM; killed it", c.name, grace)
	}
	// Anything it started itself (etcd and kube-apiserver start nothing) goes too.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	return nil
}

// waitFor polls check every interval until it succeeds, the child exits, or
// ctx ends.
func (c *child) waitFor(ctx context.Context, what string, timeout time.Duration, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	var last error
	for {
		if last = check(ctx); last == nil {
			return nil
		}
		select {
		case <-c.done:
			return c.exited()
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("%s not %s after %s: %w (log: %s)", c.name, what, timeout, last, c.logPath)
			}
			return ctx.Err()
		case <-t.C:
		}
	}
}

// lastLine is the last non-empty line of a log file, for error messages.
func lastLine(path string) string {
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
