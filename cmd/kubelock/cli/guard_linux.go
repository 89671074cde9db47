package cli

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"k8s.io/cli-runtime/pkg/genericiooptions"
)

// runGuard is `kubelock __run-guard PARENT-PID PATH ARGV0 [ARGS...]`, started
// by run (startGroup) with the status pipe on fd 3, the control pipe on fd 4
// and SIGTERM as its parent-death signal. It starts the command as the leader
// of a new process group, reaps the group's orphans (it is their subreaper),
// reports the command's end, and SIGKILLs the whole group when run dies —
// told by the parent-death signal, or by the control pipe's end-of-file — or
// when run closes the control pipe because it is done with the group.
func runGuard(args []string, s genericiooptions.IOStreams) int {
	if len(args) < 3 {
		_, _ = fmt.Fprintln(s.ErrOut, "kubelock: "+guardCommand+" is started by kubelock run, not by hand")
		return ExitUsage
	}
	parent, err := strconv.Atoi(args[0])
	status, control := os.NewFile(3, "status"), os.NewFile(4, "control")
	if err != nil || status == nil || control == nil {
		_, _ = fmt.Fprintln(s.ErrOut, "kubelock: "+guardCommand+" is started by kubelock run, not by hand")
		return ExitUsage
	}
	// The command must not inherit the pipes: run learns that the guard died
	// from the status pipe's end-of-file.
	syscall.CloseOnExec(3)
	syscall.CloseOnExec(4)
	// Caught before the command starts: from here on the parent-death signal
	// cannot end the guard without it killing the group first.
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	children := make(chan os.Signal, 1)
	signal.Notify(children, syscall.SIGCHLD)
	becomeSubreaper()
	if os.Getppid() != parent {
		return ExitError // run died before the command started
	}
	path, argv := args[1], args[2:]
	p, err := os.StartProcess(path, argv, &os.ProcAttr{
		Env:   os.Environ(),
		Files: []*os.File{os.Stdin, os.Stdout, os.Stderr},
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	})
	if err != nil {
		_, _ = fmt.Fprintf(status, "error %s\n", shown(err.Error())) // one line, whatever the path holds
		return ExitCommandNotExecutable
	}
	pgid := p.Pid
	_ = p.Release() // reaped below with wait4, as every other child
	killGroup := func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) }
	// run may have died while the command started, before its signal could be caught.
	if _, err := fmt.Fprintf(status, "started %d\n", pgid); err != nil || os.Getppid() != parent {
		killGroup()
		return ExitError
	}
	closed := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, control)
		close(closed)
	}()
	for {
		select {
		case <-signals:
			if os.Getppid() != parent {
				killGroup()
				return ExitError
			}
			// Sent to the guard itself while run lives: not the guard's to act on.
		case <-closed:
			killGroup()
			return ExitOK
		case <-children:
			reapChildren(pgid, status)
		}
	}
}

// reapChildren reaps every exited child of the guard and reports the
// command's (the group leader's) wait status.
func reapChildren(command int, status io.Writer) {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
		if pid == command {
			_, _ = fmt.Fprintf(status, "exited %d\n", uint32(ws))
		}
	}
}
