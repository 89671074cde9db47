//go:build faults

package faults

import (
	"io"
	"net"
	"sync"
	"time"
)

// balancer is a tiny TCP balancer in front of the manager replicas' webhook
// servers, as a Service would be: each connection goes to the next replica
// that accepts it. With every replica down, connections are refused.
type balancer struct {
	l        net.Listener
	backends []string
	mu       sync.Mutex
	next     int
}

func newBalancer(backends ...string) *balancer {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(err)
	b := &balancer{l: l, backends: backends}
	go b.serve()
	return b
}

func (b *balancer) addr() string { return b.l.Addr().String() }

func (b *balancer) close() { _ = b.l.Close() }

func (b *balancer) serve() {
	for {
		c, err := b.l.Accept()
		if err != nil {
			return
		}
		go b.forward(c)
	}
}

func (b *balancer) forward(c net.Conn) {
	defer c.Close()
	b.mu.Lock()
	start := b.next
	b.next++
	b.mu.Unlock()
	for i := range b.backends {
		up, err := net.DialTimeout("tcp", b.backends[(start+i)%len(b.backends)], 500*time.Millisecond)
		if err != nil {
			continue
		}
		pipe(c, up)
		return
	}
}

// pipe copies both ways until one side ends, then closes up.
func pipe(c, up net.Conn) {
	defer up.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
}
