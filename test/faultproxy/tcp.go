package faultproxy

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// TCP is a TCP proxy to one address that can delay what the upstream sends
// back. In front of etcd members it makes one apiserver's view of etcd lag:
// its watch cache receives each event late, while its requests reach etcd
// at once.
type TCP struct {
	l      net.Listener
	target string
	delay  atomic.Int64 // time.Duration

	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

// NewTCP starts a proxy to target on a free port of 127.0.0.1.
func NewTCP(target string) (*TCP, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	t := &TCP{l: l, target: target, conns: map[net.Conn]struct{}{}}
	go t.serve()
	return t, nil
}

// Addr is where it listens (host:port).
func (t *TCP) Addr() string { return t.l.Addr().String() }

// SetDelay delays every byte the upstream sends by d from now on (0: none).
func (t *TCP) SetDelay(d time.Duration) { t.delay.Store(int64(d)) }

// Close stops listening and cuts every connection.
func (t *TCP) Close() {
	_ = t.l.Close()
	t.mu.Lock()
	defer t.mu.Unlock()
	for c := range t.conns {
		_ = c.Close()
	}
}

func (t *TCP) serve() {
	for {
		c, err := t.l.Accept()
		if err != nil {
			return
		}
		go t.forward(c)
	}
}

func (t *TCP) forward(c net.Conn) {
	up, err := net.DialTimeout("tcp", t.target, 2*time.Second)
	if err != nil {
		_ = c.Close()
		return
	}
	t.track(c, up)
	defer t.untrack(c, up)
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { t.copyDelayed(c, up); done <- struct{}{} }()
	<-done
}

// copyDelayed copies from src to dst, each chunk written the delay after it
// was read: a latency, not a limit on throughput.
func (t *TCP) copyDelayed(dst io.Writer, src io.Reader) {
	type chunk struct {
		b   []byte
		due time.Time
	}
	chunks := make(chan chunk, 1024)
	go func() {
		defer close(chunks)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				chunks <- chunk{buf[:n], time.Now().Add(time.Duration(t.delay.Load()))}
			}
			if err != nil {
				return
			}
		}
	}()
	for ch := range chunks {
		time.Sleep(time.Until(ch.due))
		if _, err := dst.Write(ch.b); err != nil {
			for range chunks { // let the reader finish
			}
			return
		}
	}
}

func (t *TCP) track(cs ...net.Conn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, c := range cs {
		t.conns[c] = struct{}{}
	}
}

func (t *TCP) untrack(cs ...net.Conn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, c := range cs {
		_ = c.Close()
		delete(t.conns, c)
	}
}
