package proc

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
)

// reserved holds the lock files of the ports this process was handed, open
// until it exits.
var reserved struct {
	sync.Mutex
	files []*os.File
}

// FreePort is a port of 127.0.0.1 that nothing listens on now and that no
// other caller of FreePort on this machine is handed while this process
// runs: each port is reserved by a lock on a file of its own, held until the
// process exits (as envtest reserves the ports it picks). Test packages that
// each start a control plane at the same time then never pick the same port
// between choosing it and their child binding it.
func FreePort() (int, error) {
	dir, err := portLockDir()
	if err != nil {
		return 0, err
	}
	for range 100 {
		port, err := listenablePort()
		if err != nil {
			return 0, err
		}
		if ok, err := reservePort(dir, port); ok || err != nil {
			return port, err
		}
	}
	return 0, fmt.Errorf("no free port after 100 tries (the reservations are in %s)", dir)
}

// listenablePort is a port the kernel hands out for listening now.
func listenablePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().(*net.TCPAddr).Port, nil //nolint:errcheck // a TCP listener's address
}

// reservePort locks dir/port-<port>; false when another process (or this
// one) holds it.
func reservePort(dir string, port int) (bool, error) {
	f, err := os.OpenFile(filepath.Join(dir, "port-"+strconv.Itoa(port)), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return false, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return false, nil // held
		}
		return false, err
	}
	reserved.Lock()
	reserved.files = append(reserved.files, f)
	reserved.Unlock()
	return true, nil
}

// portLockDir is where the reservations are: in the user's cache folder,
// else the temporary one.
func portLockDir() (string, error) {
	base, err := os.UserCacheDir()
	if err != nil {
		base = os.TempDir()
	}
	dir := filepath.Join(base, "kubelock-ports")
	return dir, os.MkdirAll(dir, 0o700)
}
