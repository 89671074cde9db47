package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// cpuRoot is where cgroup v1 mounts the cpu controller.
const cpuRoot = "/sys/fs/cgroup/cpu"

// cfsPeriod is the CFS bandwidth period the quotas are shares of, in µs
// (the kernel's default).
const cfsPeriod = 100000

// cpuCgroup is a child cgroup of the cpu controller (cgroup v1) that holds
// the processes put in it to a share of one core: cfs_quota_us of every
// cfs_period_us, as a pod's CPU limit does.
type cpuCgroup struct {
	dir   string
	cores float64
}

// cpuQuotaUnavailable says why this machine cannot hold a process to a CPU
// quota, or nil when it can: root and cgroup v1's cpu controller.
func cpuQuotaUnavailable() error {
	if os.Geteuid() != 0 {
		return errors.New("not root: creating a cgroup needs root")
	}
	if _, err := os.Stat(filepath.Join(cpuRoot, "cpu.cfs_quota_us")); err != nil {
		return fmt.Errorf("no cgroup v1 cpu controller at %s: %w", cpuRoot, err)
	}
	return nil
}

// newCPUCgroup creates the cgroup name under the cpu controller's root with
// a quota of cores.
func newCPUCgroup(name string, cores float64) (*cpuCgroup, error) {
	g := &cpuCgroup{dir: filepath.Join(cpuRoot, name), cores: cores}
	if err := os.Mkdir(g.dir, 0o755); err != nil {
		return nil, err
	}
	if err := errors.Join(g.set("cpu.cfs_period_us", cfsPeriod), g.set("cpu.cfs_quota_us", int(cores*cfsPeriod))); err != nil {
		_ = g.remove()
		return nil, err
	}
	return g, nil
}

func (g *cpuCgroup) set(file string, v int) error {
	return os.WriteFile(filepath.Join(g.dir, file), []byte(strconv.Itoa(v)), 0o644)
}

// add moves process pid, every thread of it, into the cgroup.
func (g *cpuCgroup) add(pid int) error { return g.set("cgroup.procs", pid) }

// throttled is how many periods the cgroup's processes ran out of quota in,
// and of how many they ran in (cpu.stat).
func (g *cpuCgroup) throttled() (throttled, periods int64) {
	b, err := os.ReadFile(filepath.Join(g.dir, "cpu.stat"))
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, " ")
		n, _ := strconv.ParseInt(v, 10, 64)
		switch k {
		case "nr_throttled":
			throttled = n
		case "nr_periods":
			periods = n
		}
	}
	return throttled, periods
}

// remove deletes the cgroup; its processes must have exited (the kernel
// refuses to remove a cgroup with tasks).
func (g *cpuCgroup) remove() error { return os.Remove(g.dir) }
