//go:build faults

package faults

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/kubelock/kubelock/test/e2e/faults/wire"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubelock/kubelock/test/history"
)

// lockClient is one client process.
type lockClient struct {
	*process
	hist string

	mu      sync.Mutex
	nextID  int64
	waiting map[int64]chan wire.Reply
	wmu     sync.Mutex
}

// newClient starts a client process named name (unique in the suite) in the
// scenario's namespace, talking to the apiserver through the fault proxy.
func newClient(name string) *lockClient { return startClient(name, "--server="+proxy.Config().Host) }

// startClient starts a client process named name (unique in the suite) in the
// scenario's namespace, reaching the apiserver as conn says: --server=<the
// fault proxy> or --kubeconfig=<file>.
func startClient(name, conn string) *lockClient {
	hist := filepath.Join(workDir, "history", name+".jsonl")
	ready := make(chan wire.Reply, 1)
	c := &lockClient{hist: hist, waiting: map[int64]chan wire.Reply{0: ready}}
	c.process = newProcess(name, clientBin, conn, "--name="+name, "--namespace="+namespace,
		"--history="+hist, "--pg="+pgDSN)
	c.onStdout = func(line []byte) {
		var r wire.Reply
		if json.Unmarshal(line, &r) != nil {
			return
		}
		c.mu.Lock()
		ch := c.waiting[r.ID]
		delete(c.waiting, r.ID)
		c.mu.Unlock()
		if ch != nil {
			ch <- r
		}
	}
	must(c.start())
	histories = append(histories, hist)
	select {
	case r := <-ready:
		Expect(r.Outcome).To(Equal("ready"))
	case <-time.After(60 * time.Second):
		Fail(fmt.Sprintf("client %s did not start; see %s", name, c.logPath()))
	}
	return c
}

// send issues cmd and returns the channel its reply arrives on.
func (c *lockClient) send(cmd wire.Command) (int64, <-chan wire.Reply) {
	c.mu.Lock()
	c.nextID++
	cmd.ID = c.nextID
	ch := make(chan wire.Reply, 1)
	c.waiting[cmd.ID] = ch
	c.mu.Unlock()
	b, err := json.Marshal(cmd)
	must(err)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err = c.stdin.Write(append(b, '\n'))
	must(err)
	return cmd.ID, ch
}

// do issues cmd and waits for its reply.
func (c *lockClient) do(cmd wire.Command) wire.Reply {
	_, ch := c.send(cmd)
	select {
	case r := <-ch:
		return r
	case <-time.After(2 * time.Minute):
		Fail(fmt.Sprintf("client %s: no reply to %+v", c.name, cmd))
	}
	return wire.Reply{}
}

// killClient kills c and records when, so the checks end its holdings then.
func killClient(c *lockClient) int64 {
	t := c.kill()
	testRec.Record(history.Event{Proc: c.name, Op: history.OpKill, Phase: history.Point, T: t})
	return t
}

// exit asks c to release what it holds and exit, and waits.
func (c *lockClient) exit() {
	c.wmu.Lock()
	_, _ = c.stdin.Write([]byte(`{"cmd":"exit"}` + "\n"))
	c.wmu.Unlock()
	select {
	case <-c.exitedCh():
	case <-time.After(30 * time.Second):
		killClient(c)
	}
}
