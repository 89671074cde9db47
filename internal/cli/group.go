package cli

import (
	"os/exec"
	"syscall"
	"time"
)

// group is run's command in a process group of its own, so signals reach
// everything it started, grandchildren included.
type group struct {
	cmd    *exec.Cmd
	pgid   int
	exited chan struct{} // closed once cmd.Wait returned
}

func startGroup(path string, argv, env []string, s Streams) (*group, error) {
	becomeSubreaper()
	cmd := &exec.Cmd{
		Path: path, Args: argv, Env: env,
		Stdin: s.In, Stdout: s.Out, Stderr: s.ErrOut,
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	g := &group{cmd: cmd, pgid: cmd.Process.Pid, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait() // the exit status is in cmd.ProcessState
		close(g.exited)
	}()
	return g, nil
}

// signal sends sig to every process of the group.
func (g *group) signal(sig syscall.Signal) { _ = syscall.Kill(-g.pgid, sig) }

// alive reports whether any process of the group is left, after reaping those
// of its orphans that were reparented to this process. Only call it after the
// command itself was waited for, so the reaping cannot steal its status.
func (g *group) alive() bool {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-g.pgid, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			break
		}
	}
	return syscall.Kill(-g.pgid, 0) == nil
}

// drain waits for the group to empty, sending SIGKILL at killAt; it gives up
// a few seconds after the SIGKILL (processes stuck in the kernel, or zombies
// whose parent never reaps them).
func (g *group) drain(killAt time.Time) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	killed := false
	giveUp := killAt.Add(5 * time.Second)
	for g.alive() {
		now := time.Now()
		if !killed && !now.Before(killAt) {
			g.signal(syscall.SIGKILL)
			killed = true
		}
		if now.After(giveUp) {
			return
		}
		<-t.C
	}
}

// exitCode is the command's exit code as an error for Run (nil for 0), 128+N
// when signal N ended it, as shells report it.
func (g *group) exitCode() error {
	st := g.cmd.ProcessState
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return withCode(128+int(ws.Signal()), nil)
	}
	if code := st.ExitCode(); code != 0 {
		return withCode(code, nil)
	}
	return nil
}
