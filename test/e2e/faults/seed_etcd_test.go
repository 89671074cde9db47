//go:build faults

package faults

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kubelock/kubelock/internal/localcluster"
	"github.com/kubelock/kubelock/test/history"
)

// etcdMemberDown is the seed's fault: one member of store e's three (a
// follower: the seed asks for a replica down, not for a leader election)
// stopped. Its restore starts it again and waits until ready says the
// servers on e serve.
func etcdMemberDown(e *localcluster.Etcd, ready func(context.Context) error) seedFault {
	return seedFault{
		Name: "1 of 3 etcd members (a follower) stopped",
		Degrade: func(ctx context.Context) ([]*localcluster.Member, func(context.Context) string) {
			down, up := etcdFollower(ctx, e)
			from := history.Mono()
			Expect(down.Stop()).To(Succeed())
			return up, func(ctx context.Context) string {
				stopped := history.Mono() - from
				how := startOwnMachine(ctx, down.Component)
				Expect(ready(ctx)).To(Succeed())
				return fmt.Sprintf("%s stopped for %s, restarted %s: healthy and its servers ready %s later",
					down.Name, secs(stopped), how, secs(history.Mono()-from-stopped))
			}
		},
	}
}

// maintainInWindow compacts the keyspace to its current revision a sixth
// into the window that opened at from and then defragments each member of up
// in turn, as an operator runs `etcdctl compact` and then `etcdctl defrag`
// one member at a time; the returned wait checks that all of it ended inside
// the window and says what it did.
func maintainInWindow(ctx context.Context, up []*localcluster.Member, from int64, window time.Duration) (wait func() string) {
	done := make(chan maintenance, 1)
	go func() {
		// The fault's schedule, not synchronisation: a sixth into the
		// window, however long the fault took to put in place.
		time.Sleep(time.Duration(from + int64(window/6) - history.Mono()))
		done <- compactAndDefragment(ctx, up, from)
	}()
	return func() string {
		var m maintenance
		Eventually(done).WithTimeout(2 * time.Minute).Should(Receive(&m))
		Expect(m.err).NotTo(HaveOccurred(), "compaction and defragmentation: %s", m)
		Expect(m.end).To(BeNumerically("<", from+int64(window)), "the compaction and defragmentation ran past the window: %s", m)
		return m.String()
	}
}

// running is the members of e that are running.
func running(e *localcluster.Etcd) []*localcluster.Member {
	var up []*localcluster.Member
	for _, m := range e.Members {
		if m.Running() != nil {
			up = append(up, m)
		}
	}
	return up
}

// startOwnMachine starts c at the lowest CPU priority until it is ready,
// then at normal priority, and says how. On a production control plane an
// etcd member or a kube-apiserver restarts on a machine of its own; here its
// start (a member reads its WAL and rebuilds its index: 0.7 CPU-seconds for
// one of 63 MiB; an apiserver fills its caches) took the two cores its peers,
// the apiserver and the operator serve the clients from, and the first
// seconds after a member's restart at normal priority reached 323 ms
// (docs/reliability.md). Neither serves a client before it is ready: a
// member once it has caught up with the cluster, an apiserver once /readyz
// passes, which HAProxy checks too. Raising a process's priority back takes
// root; without it c starts at normal priority.
func startOwnMachine(ctx context.Context, c *localcluster.Component) string {
	if os.Geteuid() != 0 {
		Expect(c.Start(ctx)).To(Succeed())
		return "at normal priority (not root)"
	}
	path, args := c.Path, c.Args
	c.Path, c.Args = "nice", append([]string{"-n", "19", path}, args...)
	err := c.Start(ctx)
	c.Path, c.Args = path, args
	Expect(err).NotTo(HaveOccurred())
	// Linux keeps a priority per thread, and a thread starts with its
	// creator's: every thread of the process goes back, twice in case one
	// was being created during the first pass.
	pid := c.Running().Pid()
	for range 2 {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		Expect(err).NotTo(HaveOccurred())
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			Expect(err).NotTo(HaveOccurred())
			Expect(syscall.Setpriority(syscall.PRIO_PROCESS, tid, 0)).To(Succeed(), "%s back to normal priority", c.Name)
		}
	}
	return "at the lowest CPU priority until ready"
}

// etcdFollower is a member that does not lead, and the others.
func etcdFollower(ctx context.Context, e *localcluster.Etcd) (*localcluster.Member, []*localcluster.Member) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints(), DialTimeout: 10 * time.Second})
	Expect(err).NotTo(HaveOccurred())
	defer func() { _ = cli.Close() }()
	for i := len(e.Members) - 1; i >= 0; i-- {
		st, err := cli.Status(ctx, e.Members[i].ClientURL)
		Expect(err).NotTo(HaveOccurred())
		if st.Header.MemberId != st.Leader {
			others := append([]*localcluster.Member{}, e.Members[:i]...)
			return e.Members[i], append(others, e.Members[i+1:]...)
		}
	}
	Fail("no etcd member is a follower")
	return nil, nil
}

// maintenance is what compactAndDefragment did, with offsets from the
// window's start.
type maintenance struct {
	steps []string
	end   int64
	err   error
}

func (m maintenance) String() string { return strings.Join(m.steps, "; ") }

// compactAndDefragment compacts the keyspace to its current revision
// (physically: it returns once the members have dropped the old revisions)
// and then defragments each member of up in turn.
func compactAndDefragment(ctx context.Context, up []*localcluster.Member, from int64) (m maintenance) {
	defer func() { m.end = history.Mono() }()
	at := func() string { return "+" + secs(history.Mono()-from) }
	var urls []string
	for _, u := range up {
		urls = append(urls, u.ClientURL)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: urls, DialTimeout: 10 * time.Second})
	if err != nil {
		return maintenance{err: err}
	}
	defer func() { _ = cli.Close() }()
	st, err := cli.Status(ctx, urls[0])
	if err != nil {
		return maintenance{err: err}
	}
	rev, began, t := st.Header.Revision, at(), time.Now()
	if _, m.err = cli.Compact(ctx, rev, clientv3.WithCompactPhysical()); m.err != nil {
		return m
	}
	m.steps = append(m.steps, fmt.Sprintf("compacted to revision %d at %s in %s", rev, began, since(t)))
	for _, u := range up {
		before, err := cli.Status(ctx, u.ClientURL)
		if err != nil {
			m.err = err
			return m
		}
		began, t = at(), time.Now()
		if _, m.err = cli.Defragment(ctx, u.ClientURL); m.err != nil {
			return m
		}
		took := since(t)
		after, err := cli.Status(ctx, u.ClientURL)
		if err != nil {
			m.err = err
			return m
		}
		m.steps = append(m.steps, fmt.Sprintf("%s defragmented at %s in %s (%s → %s)", u.Name, began, took, mib(before.DbSize), mib(after.DbSize)))
	}
	return m
}

func since(t time.Time) string { return time.Since(t).Round(time.Millisecond).String() }

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
