package proc

import (
	"net"
	"strconv"
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
