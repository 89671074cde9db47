package proc

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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
//
// The port lies below the kernel's ephemeral range, from which it picks the
// local port of every outgoing connection: a port of that range that nothing
// listens on can be some connection's source port by the time the child
// binds it (CI saw a member of etcd fail so, "address already in use", on a
// machine busy with the fault suite's clients).
func FreePort() (int, error) {
	dir, err := portLockDir()
	if err != nil {
		return 0, err
	}
	lo, hi := listenRange()
	for range 100 {
		port, err := listenablePort(lo, hi)
		if err != nil {
			return 0, err
		}
		if port == 0 {
			continue // taken now
		}
		if ok, err := reservePort(dir, port); ok || err != nil {
			return port, err
		}
	}
	return 0, fmt.Errorf("no free port in %d-%d after 100 tries (the reservations are in %s)", lo, hi, dir)
}

const (
	// lowestPort is above the fixed ports a node's components bind (the
	// kubelet's 10250, kube-proxy's 10256) and most services' defaults.
	lowestPort = 20000
	// nodePortStart begins Kubernetes' NodePort range, which a node's
	// kube-proxy may bind.
	nodePortStart = 30000
	// ephemeralFile is where Linux keeps its ephemeral range.
	ephemeralFile = "/proc/sys/net/ipv4/ip_local_port_range"
)

// FreePorts are n ports as FreePort hands them out.
func FreePorts(n int) ([]int, error) {
	ports := make([]int, n)
	for i := range ports {
		var err error
		if ports[i], err = FreePort(); err != nil {
			return nil, err
		}
	}
	return ports, nil
}

// listenRange is where FreePort picks: [lowestPort, the ephemeral range's
// start or NodePort's, whichever is lower). 0, 0 when that leaves too few
// ports (a kernel tuned to a wide ephemeral range): then the kernel picks,
// as it would for a listener on port 0.
func listenRange() (lo, hi int) {
	end := nodePortStart
	if b, err := os.ReadFile(ephemeralFile); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if start, err := strconv.Atoi(f[0]); err == nil {
				end = min(end, start)
			}
		}
	}
	if end-lowestPort < 1000 {
		return 0, 0
	}
	return lowestPort, end - 1
}

// listenablePort is a port in [lo, hi] (or the kernel's choice, for 0, 0)
// that 127.0.0.1 can listen on now; 0 when the one tried is taken.
func listenablePort(lo, hi int) (int, error) {
	port := 0
	if hi > 0 {
		port = lo + rand.IntN(hi-lo+1) //nolint:gosec // a port to try, not a secret
	}
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		if port != 0 && errors.Is(err, syscall.EADDRINUSE) {
			return 0, nil
		}
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
