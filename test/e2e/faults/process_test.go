//go:build faults

package faults

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

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
	cmd        *exec.Cmd
	exited     chan struct{}
	paused     bool
}

func newProcess(name, bin string, args ...string) *process {
	return &process{name: name, bin: bin, args: args, dir: workDir}
}

func (p *process) logPath() string { return filepath.Join(p.dir, p.name+".log") }

// start runs the process; it must not be running.
func (p *process) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	log, err := os.OpenFile(p.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(log, "==== start %s %v\n", time.Now().Format(time.RFC3339Nano), p.args)
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = log, log
	var stdout io.ReadCloser
	if p.onStdout != nil {
		cmd.Stdout = nil
		if p.stdin, err = cmd.StdinPipe(); err != nil {
			return err
		}
		if stdout, err = cmd.StdoutPipe(); err != nil {
			return err
		}
	}
	// Its own process group, and killed with the suite.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		return fmt.Errorf("starting %s: %w", p.name, err)
	}
	exited := make(chan struct{})
	read := make(chan struct{})
	go func() {
		defer close(read)
		if stdout == nil {
			return
		}
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.onStdout(append([]byte(nil), sc.Bytes()...))
		}
	}()
	go func() {
		<-read
		_ = cmd.Wait()
		_ = log.Close()
		close(exited)
		p.mu.Lock()
		again := p.supervised && p.cmd == cmd
		p.mu.Unlock()
		if again {
			time.Sleep(time.Second) // restart back-off
			p.mu.Lock()
			again = p.supervised && p.cmd == cmd
			if again {
				p.restarts++
			}
			p.mu.Unlock()
			if again {
				_ = p.start()
			}
		}
	}()
	p.cmd, p.exited, p.paused = cmd, exited, false
	return nil
}

func (p *process) supervise(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.supervised = on
}

// exitedCh is closed when the current run of the process ends.
func (p *process) exitedCh() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited
}

func (p *process) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

func (p *process) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return fmt.Errorf("%s is not running", p.name)
	}
	return p.cmd.Process.Signal(sig)
}

// pause stops the process (SIGSTOP) and returns when.
func (p *process) pause() int64 {
	t := history.Mono()
	must(p.signal(syscall.SIGSTOP))
	p.mu.Lock()
	p.paused = true
	p.mu.Unlock()
	return t
}

// resume continues a paused process (SIGCONT).
func (p *process) resume() {
	must(p.signal(syscall.SIGCONT))
	p.mu.Lock()
	p.paused = false
	p.mu.Unlock()
}

// kill sends SIGKILL, waits until the process is gone and returns the time
// just before the signal.
func (p *process) kill() int64 {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		return history.Mono()
	}
	t := history.Mono()
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-exited
	return t
}

// stop sends SIGTERM (SIGCONT first if paused) and waits up to 20s, then kills.
func (p *process) stop() {
	p.mu.Lock()
	cmd, exited, paused := p.cmd, p.exited, p.paused
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	p.mu.Lock()
	p.supervised = false
	p.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if paused {
		_ = cmd.Process.Signal(syscall.SIGCONT)
	}
	select {
	case <-exited:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-exited
	}
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(err)
	defer l.Close()
	addr, ok := l.Addr().(*net.TCPAddr)
	if !ok {
		panic("not a TCP address")
	}
	return addr.Port
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}
