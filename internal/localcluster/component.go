package localcluster

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/kubelock/kubelock/internal/proc"
)

// DefaultStartTimeout bounds a component's start when nothing else does.
const DefaultStartTimeout = time.Minute

// stopGrace is how long a component has to stop after SIGTERM.
const stopGrace = 20 * time.Second

// Component is one process of a cluster (an etcd member, a kube-apiserver,
// the node's kubelet...): run with the same command line at every start, its
// output appended to one log, ready once its check passes. Each can be
// stopped and started again on its own, as the fault suite stops etcd members
// and kills an apiserver. Set the fields before the first Start.
type Component struct {
	// Name names it in errors and progress lines.
	Name string
	// Path and Args are its command; Env, when set, its environment.
	Path string
	Args []string
	Env  []string
	// LogPath receives its stdout and stderr.
	LogPath string
	// Ready is polled after each start until it succeeds (nil: at once);
	// Readiness says what it checks ("healthy", "ready"), for errors.
	Ready     func(ctx context.Context) error
	Readiness string
	// StartTimeout bounds the wait for Ready (DefaultStartTimeout when 0).
	StartTimeout time.Duration

	mu     sync.Mutex
	run    *proc.Child // the current run; nil when stopped
	asked  bool        // the current run's end was asked for (Stop, Kill)
	failed chan error
}

// Start runs the component and returns once it is ready; it fails when it
// is running already.
func (c *Component) Start(ctx context.Context) error {
	if err := c.launch(); err != nil {
		return err
	}
	return c.WaitReady(ctx)
}

// launch starts the process without waiting for it to be ready (the members
// of an etcd cluster become ready together).
func (c *Component) launch() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.run != nil {
		return fmt.Errorf("%s is running already", c.Name)
	}
	cmd := exec.Command(c.Path, c.Args...)
	if c.Env != nil {
		cmd.Env = c.Env
	}
	run, err := proc.StartCmd(c.Name, cmd, c.LogPath)
	if err != nil {
		return err
	}
	c.run, c.asked = run, false
	if c.failed == nil {
		c.failed = make(chan error, 1)
	}
	go c.watch(run)
	return nil
}

// watch reports run's end on Failed unless it was asked for.
func (c *Component) watch(run *proc.Child) {
	<-run.Done()
	c.mu.Lock()
	unasked := c.run == run && !c.asked
	c.mu.Unlock()
	if unasked {
		select {
		case c.failed <- run.Exited():
		default: // one failure is enough to act on
		}
	}
}

// WaitReady polls Ready until it succeeds, the process exits, or
// StartTimeout or ctx ends.
func (c *Component) WaitReady(ctx context.Context) error {
	run := c.Running()
	if run == nil {
		return fmt.Errorf("%s is not running", c.Name)
	}
	if c.Ready == nil {
		return nil
	}
	timeout := c.StartTimeout
	if timeout == 0 {
		timeout = DefaultStartTimeout
	}
	return run.WaitFor(ctx, c.Readiness, timeout, c.Ready)
}

// Stop ends the process (SIGTERM, then SIGKILL after 20 s); a stopped
// component stops at once.
func (c *Component) Stop() error {
	run := c.ask()
	if run == nil {
		return nil
	}
	err := run.Stop(stopGrace)
	c.forget(run)
	return err
}

// Kill ends the process with SIGKILL, as a crash would, and returns once it
// is gone.
func (c *Component) Kill() {
	run := c.ask()
	if run == nil {
		return
	}
	_ = run.Signal(syscall.SIGKILL)
	<-run.Done()
	c.forget(run)
}

// Running is the current run, nil when the component is stopped.
func (c *Component) Running() *proc.Child {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.run
}

// Failed receives the error of a run that ended without Stop or Kill asking
// it to; every run of the component reports there.
func (c *Component) Failed() <-chan error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failed == nil {
		c.failed = make(chan error, 1)
	}
	return c.failed
}

// ask marks the current run's end as asked for and returns it.
func (c *Component) ask() *proc.Child {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.asked = true
	return c.run
}

func (c *Component) forget(run *proc.Child) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.run == run {
		c.run = nil
	}
}

// StopAll stops the components in reverse order.
func StopAll(cs []*Component) error {
	var errs []error
	for i := len(cs) - 1; i >= 0; i-- {
		errs = append(errs, cs[i].Stop())
	}
	return errors.Join(errs...)
}
