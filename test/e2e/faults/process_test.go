//go:build faults

package faults

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/kubelock/kubelock/internal/proc"
	"github.com/kubelock/kubelock/test/history"
)

// process is a child the suite can start, pause, resume, kill and restart
// with the same arguments. Its output goes to a log file in the work dir.
type process struct {
	name string
	bin  string
	args []string
	env  []string
	dir  string

	// onStdout, when set, makes start connect stdin (to stdin) and stdout
	// (to onStdout, line by line) instead of the log.
	onStdout func(line []byte)
	stdin    io.WriteCloser

	mu sync.Mutex
	// supervised processes are started again a second after they exit
	// unasked, as a kubelet restarts a container (managers exit when they
	// lose leader election).
	supervised bool
	restarts   int
	child      *proc.Child
}

func newProcess(name, bin string, args ...string) *process {
	return &process{name: name, bin: bin, args: args, dir: workDir}
}

func (p *process) logPath() string { return filepath.Join(p.dir, p.name+".log") }

// start runs the process; it must not be running.
func (p *process) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	if p.onStdout != nil {
		var err error
		if p.stdin, err = cmd.StdinPipe(); err != nil {
			return err
		}
		cmd.Stdout = &lineWriter{each: p.onStdout}
	}
	c, err := proc.StartCmd(p.name, cmd, p.logPath())
	if err != nil {
		return err
	}
	p.child = c
	go p.restartOnExit(c)
	return nil
}

func (p *process) restartOnExit(c *proc.Child) {
	<-c.Done()
	time.Sleep(time.Second) // restart back-off
	p.mu.Lock()
	again := p.supervised && p.child == c
	if again {
		p.restarts++
	}
	p.mu.Unlock()
	if again {
		_ = p.start()
	}
}

// lineWriter hands each complete line written to it, without its newline, to each.
type lineWriter struct {
	buf  []byte
	each func(line []byte)
}

func (w *lineWriter) Write(b []byte) (int, error) {
	w.buf = append(w.buf, b...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(b), nil
		}
		w.each(append([]byte(nil), w.buf[:i]...))
		w.buf = w.buf[i+1:]
	}
}

func (p *process) supervise(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.supervised = on
}

func (p *process) current() *proc.Child {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.child
}

// exitedCh is closed when the current run of the process ends.
func (p *process) exitedCh() <-chan struct{} {
	if c := p.current(); c != nil {
		return c.Done()
	}
	return nil
}

func (p *process) running() bool {
	c := p.current()
	return c != nil && c.Exited() == nil
}

func (p *process) signal(sig syscall.Signal) error {
	c := p.current()
	if c == nil {
		return fmt.Errorf("%s is not running", p.name)
	}
	return c.Signal(sig)
}

// pause stops the process (SIGSTOP) and returns when.
func (p *process) pause() int64 {
	t := history.Mono()
	must(p.signal(syscall.SIGSTOP))
	return t
}

// resume continues a paused process (SIGCONT).
func (p *process) resume() { must(p.signal(syscall.SIGCONT)) }

// kill sends SIGKILL, waits until the process is gone and returns the time
// just before the signal.
func (p *process) kill() int64 {
	c := p.current()
	t := history.Mono()
	if c != nil {
		_ = c.Signal(syscall.SIGKILL)
		<-c.Done()
	}
	return t
}

// stop sends SIGTERM (and SIGCONT, should it be paused) and waits up to 20s, then kills.
func (p *process) stop() {
	p.supervise(false)
	if c := p.current(); c != nil {
		_ = c.Stop(20 * time.Second)
	}
}

// freePort is a port nothing listens on, reserved for this process.
func freePort() int {
	p, err := proc.FreePort()
	must(err)
	return p
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}
