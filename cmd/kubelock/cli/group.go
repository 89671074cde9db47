package cli

import (
	"syscall"
	"time"
)

// guardCommand, as kubelock's first argument, makes it run's guard process
// (runGuard); it is not a command of the CLI and appears in no help.
const guardCommand = "__run-guard"

// group is run's command in a process group of its own, so signals reach
// everything it started, grandchildren included. On Linux a guard process
// (see guard_linux.go) starts the command and kills the group when this
// process dies, even by SIGKILL; elsewhere the command is this process's child.
type group struct {
	pgid   int
	guard  int           // the guard's pid, 0 without one
	exited chan struct{} // closed once the command ended; then ws or err is set
	ws     syscall.WaitStatus
	err    error // the command's status is unknown (its guard died)
	// done lets go of the group once it is empty: the guard exits. Nil
	// without a guard.
	done func()
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

// finish lets the guard go (it SIGKILLs whatever is still in the group).
func (g *group) finish() {
	if g.done != nil {
		g.done()
		g.done = nil
	}
}

// exitCode is the command's exit code as an error for Run (nil for 0), 128+N
// when signal N ended it, as shells report it.
func (g *group) exitCode() error {
	switch {
	case g.err != nil:
		return withCode(ExitError, g.err)
	case g.ws.Signaled():
		return withCode(128+int(g.ws.Signal()), nil)
	case g.ws.ExitStatus() != 0:
		return withCode(g.ws.ExitStatus(), nil)
	}
	return nil
}

// graceUntil is when the group gets SIGKILL after a SIGTERM at now: grace
// later, but never after the lease's safe deadline, so that nothing of the
// command runs once someone else could hold the lock.
func graceUntil(now time.Time, grace time.Duration, leaseEnd time.Time) time.Time {
	at := now.Add(grace)
	if leaseEnd.Before(at) {
		at = leaseEnd
	}
	if at.Before(now) {
		return now
	}
	return at
}
