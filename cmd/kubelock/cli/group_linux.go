package cli

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/cli-runtime/pkg/genericiooptions"
)

// startGroup starts the run guard (kubelock itself, see runGuard), which
// starts the command as the leader of a new process group and SIGKILLs that
// group as soon as this process dies, whatever kills it. The guard reports on
// its status pipe ("started PGID", "exited WAITSTATUS" or "error MESSAGE") and
// stays until this process closes the control pipe (g.finish) or dies.
func startGroup(path string, argv, env []string, s genericiooptions.IOStreams) (*group, error) {
	becomeSubreaper() // orphans of a guard that died come here, to be reaped
	statusR, statusW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	controlR, controlW, err := os.Pipe()
	if err != nil {
		_, _ = statusR.Close(), statusW.Close()
		return nil, err
	}
	guard := &exec.Cmd{
		// The running binary, even if its file was replaced or removed since.
		Path:       "/proc/self/exe",
		Args:       append([]string{"kubelock", guardCommand, strconv.Itoa(os.Getpid()), path}, argv...),
		Env:        env,
		Stdin:      s.In,
		Stdout:     s.Out,
		Stderr:     s.ErrOut,
		ExtraFiles: []*os.File{statusW, controlR}, // fds 3 and 4 of the guard
		// A group of its own, so that signals for this process's group (a
		// shell's kill -9 %1) do not kill the guard with it.
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM},
	}
	started := make(chan error, 1)
	guardDone := make(chan struct{})
	go func() {
		defer close(guardDone)
		// The parent-death signal fires when the OS thread that forked the
		// guard exits, not only the process: keep this goroutine on its
		// thread, and the thread alive, for as long as the guard runs.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		err := guard.Start()
		started <- err
		if err == nil {
			_ = guard.Wait()
		}
	}()
	err = <-started
	_, _ = statusW.Close(), controlR.Close() // the guard's ends
	if err != nil {
		_, _ = statusR.Close(), controlW.Close()
		return nil, err
	}
	stop := func() {
		_ = controlW.Close()
		select {
		case <-guardDone:
		case <-time.After(5 * time.Second):
		}
	}
	lines := bufio.NewScanner(statusR)
	var first string
	if lines.Scan() {
		first = lines.Text()
	}
	verb, arg, _ := strings.Cut(first, " ")
	pgid, _ := strconv.Atoi(arg)
	if verb != "started" || pgid <= 1 {
		stop()
		_ = statusR.Close()
		if verb == "error" {
			return nil, errors.New(arg)
		}
		return nil, errors.New("the run guard ended before it started the command")
	}
	g := &group{pgid: pgid, guard: guard.Process.Pid, exited: make(chan struct{}), done: stop}
	go g.watchGuard(lines, statusR)
	return g, nil
}

// watchGuard waits for the guard's report of the command's end. If the guard
// dies first, this process does what the guard would have done.
func (g *group) watchGuard(lines *bufio.Scanner, statusR *os.File) {
	defer func() { _ = statusR.Close() }()
	defer close(g.exited)
	for lines.Scan() {
		verb, arg, _ := strings.Cut(lines.Text(), " ")
		if ws, err := strconv.ParseUint(arg, 10, 32); verb == "exited" && err == nil {
			g.ws = syscall.WaitStatus(ws)
			return
		}
	}
	g.signal(syscall.SIGKILL)
	g.err = errorf("the run guard died before the command ended; its process group was killed")
}
