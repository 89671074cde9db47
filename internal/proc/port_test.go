package proc

import (
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestFreePortNeverTwice checks that a port handed out once is not handed
// out again, even once nothing listens on it any more.
func TestFreePortNeverTwice(t *testing.T) {
	seen := map[int]bool{}
	for range 20 {
		p, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Fatalf("port %d is not free: %v", p, err)
		}
		_ = ln.Close()
	}
	for p := range seen {
		if ok, err := reservePort(mustLockDir(t), p); ok || err != nil {
			t.Errorf("port %d: reserved again (%v, %v)", p, ok, err)
		}
	}
}

func mustLockDir(t *testing.T) string {
	t.Helper()
	dir, err := portLockDir()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestFreePortBelowEphemeralRange checks that a port handed out is never one
// the kernel could give an outgoing connection as its source port.
func TestFreePortBelowEphemeralRange(t *testing.T) {
	lo, hi := listenRange()
	if hi == 0 {
		t.Skipf("the ephemeral range in %s leaves no room below it; FreePort lets the kernel pick", ephemeralFile)
	}
	b, err := os.ReadFile(ephemeralFile)
	if err != nil {
		t.Fatal(err)
	}
	start, err := strconv.Atoi(strings.Fields(string(b))[0])
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		p, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if p < lo || p > hi || p >= start {
			t.Fatalf("port %d: want it in %d-%d, below the ephemeral range's start %d", p, lo, hi, start)
		}
	}
}
