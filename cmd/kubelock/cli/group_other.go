//go:build !linux

package cli

import (
	"os/exec"
	"syscall"

	"k8s.io/cli-runtime/pkg/genericiooptions"
)

// startGroup starts the command as this process's child, leader of its own
// process group. Without a parent-death signal, a SIGKILL of this process
// leaves the group running.
func startGroup(path string, argv, env []string, s genericiooptions.IOStreams) (*group, error) {
	becomeSubreaper()
	cmd := &exec.Cmd{
		Path: path, Args: argv, Env: env,
		Stdin: s.In, Stdout: s.Out, Stderr: s.ErrOut,
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	g := &group{pgid: cmd.Process.Pid, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait() // the exit status is in cmd.ProcessState
		g.ws, _ = cmd.ProcessState.Sys().(syscall.WaitStatus)
		close(g.exited)
	}()
	return g, nil
}

// runGuard exists on Linux only.
func runGuard(_ []string, s genericiooptions.IOStreams) int {
	_, _ = s.ErrOut.Write([]byte("kubelock: the run guard exists on Linux only\n"))
	return ExitUsage
}
