package devenv

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The host state --node changes beyond its data folder, and how it is put
// back. kubelet, containerd and the CNI plugins use fixed host paths, mounts,
// cgroups, a bridge, iptables rules and sysctls; the record of what was there
// before is kept in hostStateFile while the node runs, so a run that died
// without cleaning up is cleaned up by the next one.
const (
	hostRunDir    = "/run/kubelock-dev"
	hostLockFile  = hostRunDir + "/node.lock"
	hostStateFile = hostRunDir + "/node.json"
)

// fixedHostPaths are the host paths the node's components write whatever
// their configuration says; those that did not exist before are removed.
var fixedHostPaths = []string{
	"/var/lib/kubelet", "/var/log/containers", "/var/log/pods", "/var/lib/cni",
	"/run/containerd", "/run/netns", "/etc/cni", "/opt/cni", "/var/lib/containerd", "/etc/kubernetes",
}

// hostSysctls are the ones kubelet, kube-proxy and the bridge plugin set; they get their old values back.
var hostSysctls = []string{
	"net/ipv4/ip_forward", "net/ipv4/conf/all/route_localnet",
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
	"net/netfilter/nf_conntrack_tcp_timeout_established", "net/netfilter/nf_conntrack_tcp_timeout_close_wait",
}

type hostState struct {
	// Created are the fixedHostPaths this node created.
	Created []string `json:"created"`
	// Sysctls are the values before, by /proc/sys path.
	Sysctls map[string]string `json:"sysctls"`
	// MountRoots: every mount under them is the node's (the kubelet's root, containerd's folders, netns).
	MountRoots []string `json:"mountRoots"`
	// NodeDir is the data folder's node part, removed at the end; Shim the
	// shim binary whose processes are the node's; KubeProxy cleans up its rules.
	NodeDir   string `json:"nodeDir"`
	Shim      string `json:"shim"`
	KubeProxy string `json:"kubeProxy"`
	// Chains are the KUBE-* and CNI-* iptables chains there before, by
	// command and table: the others, and the rules jumping to them, are the node's.
	Chains map[string][]string `json:"chains"`
}

// claimHost takes the machine's one node lock, cleans up after an earlier
// run that died, and records the host state as it is now.
func (e *env) claimHost() error {
	if err := os.MkdirAll(hostRunDir, 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(hostLockFile, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		return fmt.Errorf("another kubelock-dev --node runs on this machine (it holds %s): one node per machine", hostLockFile)
	}
	e.hostLock = f
	if data, err := os.ReadFile(hostStateFile); err == nil {
		var old hostState
		if err := json.Unmarshal(data, &old); err == nil {
			e.progress("cleaning up the host state an earlier --node run left")
			if err := old.cleanup(); err != nil {
				return fmt.Errorf("cleaning up after an earlier --node run: %w", err)
			}
		}
	}
	// The shims' /proc/<pid>/exe is the real path.
	abs := func(p string) string {
		a, _ := filepath.Abs(p)
		if r, err := filepath.EvalSymlinks(a); err == nil {
			return r
		}
		return a
	}
	s := &hostState{
		Sysctls:    map[string]string{},
		MountRoots: []string{e.nodeDir(), "/var/lib/kubelet", "/run/containerd", "/run/netns"},
		NodeDir:    e.nodeDir(),
		Shim:       abs(filepath.Join(e.o.NodeDir, "containerd-shim-runc-v2")),
		KubeProxy:  abs(filepath.Join(e.o.AssetsDir, "kube-proxy")),
	}
	for _, p := range fixedHostPaths {
		if _, err := os.Lstat(p); errors.Is(err, os.ErrNotExist) {
			s.Created = append(s.Created, p)
		}
	}
	for _, k := range hostSysctls {
		if v, err := os.ReadFile(filepath.Join("/proc/sys", k)); err == nil {
			s.Sysctls[k] = strings.TrimSpace(string(v))
		}
	}
	s.Chains = map[string][]string{}
	for _, cmd := range iptablesCmds {
		for _, table := range iptablesTables {
			if out, err := exec.Command(cmd+"-save", "-t", table).Output(); err == nil {
				chains, _ := nodeChains(string(out), nil)
				s.Chains[cmd+" "+table] = chains
			}
		}
	}
	data, err := json.Marshal(s)
	if err != nil {
		return err
	}
	e.host = s
	return writeFile(hostStateFile, data)
}

// releaseHost puts the host back as claimHost found it (the node's processes
// have stopped) and frees the node lock.
func (e *env) releaseHost() error {
	if e.hostLock == nil {
		return nil
	}
	var err error
	if e.host != nil {
		if err = e.host.cleanup(); err == nil {
			err = os.Remove(hostStateFile)
		}
	}
	_ = os.Remove(hostLockFile)
	_ = e.hostLock.Close()    // and with it the lock
	_ = os.Remove(hostRunDir) // when empty
	e.hostLock = nil
	if err == nil {
		e.progress("host state cleaned up")
	}
	return err
}

// cleanup kills the node's containers and shims, unmounts, removes the pods'
// cgroups, the bridge, kube-proxy's iptables rules and the paths the node
// created, and restores the sysctls.
func (s *hostState) cleanup() error {
	var errs []error
	s.killContainers()
	errs = append(errs, s.unmount())
	errs = append(errs, removeCgroups("kubepods"))
	if out, err := exec.Command("ip", "link", "del", bridgeName).CombinedOutput(); err != nil && !strings.Contains(string(out), "Cannot find") {
		errs = append(errs, fmt.Errorf("deleting bridge %s: %w: %s", bridgeName, err, out))
	}
	if s.KubeProxy != "" {
		if out, err := exec.Command(s.KubeProxy, "--cleanup").CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("kube-proxy --cleanup: %w: %s", err, lastLine(out)))
		}
	}
	errs = append(errs, s.removeChains())
	if entries, err := os.ReadDir("/run/netns"); err == nil {
		for _, en := range entries {
			if strings.HasPrefix(en.Name(), "cni-") {
				errs = append(errs, os.Remove(filepath.Join("/run/netns", en.Name())))
			}
		}
	}
	for _, p := range append(append([]string(nil), s.Created...), s.NodeDir) {
		if p != "" {
			errs = append(errs, os.RemoveAll(p))
		}
	}
	for k, v := range s.Sysctls {
		errs = append(errs, os.WriteFile(filepath.Join("/proc/sys", k), []byte(v+"\n"), 0o644))
	}
	return errors.Join(errs...)
}

// killContainers kills the containers (they hold mounts and cgroups), then their shims.
func (s *hostState) killContainers() {
	for i := 0; i < 50 && s.killAll() > 0; i++ {
		time.Sleep(100 * time.Millisecond)
	}
}

// killAll SIGKILLs the processes in the pods' cgroups and the node's shims
// and returns how many it found.
func (s *hostState) killAll() int {
	pids := map[int]bool{}
	for _, dir := range cgroupDirs("kubepods") {
		_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.Name() == "cgroup.procs" {
				data, _ := os.ReadFile(p)
				for _, f := range strings.Fields(string(data)) {
					if pid, err := strconv.Atoi(f); err == nil {
						pids[pid] = true
					}
				}
			}
			return nil
		})
	}
	if len(pids) == 0 && s.Shim != "" {
		procs, _ := os.ReadDir("/proc")
		for _, p := range procs {
			if pid, err := strconv.Atoi(p.Name()); err == nil {
				if exe, err := os.Readlink(filepath.Join("/proc", p.Name(), "exe")); err == nil && exe == s.Shim {
					pids[pid] = true
				}
			}
		}
	}
	for pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	return len(pids)
}

// unmount detaches every mount under the node's mount roots, deepest first.
func (s *hostState) unmount() error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := strings.ReplaceAll(fields[4], `\040`, " ")
		for _, root := range s.MountRoots {
			if mp == root || strings.HasPrefix(mp, root+"/") {
				points = append(points, mp)
				break
			}
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	var errs []error
	for _, mp := range points {
		if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", mp, err))
		}
	}
	return errors.Join(errs...)
}

// cgroupDirs is name's folder in every cgroup hierarchy that has it.
func cgroupDirs(name string) []string {
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", name))
	if st, err := os.Stat(filepath.Join("/sys/fs/cgroup", name)); err == nil && st.IsDir() {
		dirs = append(dirs, filepath.Join("/sys/fs/cgroup", name)) // cgroup v2
	}
	return dirs
}

// removeCgroups removes name's cgroup trees, innermost first; a cgroup is
// removable once its processes are gone, which takes a moment after SIGKILL.
func removeCgroups(name string) error {
	var last error
	for i := 0; i < 50; i++ {
		last = nil
		for _, dir := range cgroupDirs(name) {
			var tree []string
			_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					tree = append(tree, p)
				}
				return nil
			})
			for j := len(tree) - 1; j >= 0; j-- {
				if err := syscall.Rmdir(tree[j]); err != nil && !errors.Is(err, syscall.ENOENT) {
					last = fmt.Errorf("removing cgroup %s: %w", tree[j], err)
				}
			}
		}
		if last == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return last
}

func lastLine(out []byte) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}

var (
	iptablesCmds   = []string{"iptables", "ip6tables"}
	iptablesTables = []string{"filter", "nat", "mangle"}
)

// removeChains removes the KUBE-* and CNI-* chains that were not there
// before (the kubelet's firewall and canaries, what kube-proxy --cleanup
// leaves) with the rules that jump to them.
func (s *hostState) removeChains() error {
	var errs []error
	for _, cmd := range iptablesCmds {
		for _, table := range iptablesTables {
			out, err := exec.Command(cmd+"-save", "-t", table).Output()
			if err != nil {
				continue
			}
			chains, jumps := nodeChains(string(out), s.Chains[cmd+" "+table])
			for _, rule := range jumps {
				errs = append(errs, run(cmd, append([]string{"-t", table, "-D"}, rule...)...))
			}
			for _, flag := range []string{"-F", "-X"} {
				for _, c := range chains {
					errs = append(errs, run(cmd, "-t", table, flag, c))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// nodeChains reads iptables-save output: the KUBE-* and CNI-* chains not in
// before, and the rules of other chains that jump to them (as arguments for -D).
func nodeChains(save string, before []string) (chains []string, jumps [][]string) {
	old := map[string]bool{}
	for _, c := range before {
		old[c] = true
	}
	mine := map[string]bool{}
	lines := strings.Split(save, "\n")
	for _, line := range lines {
		if name, ok := strings.CutPrefix(line, ":"); ok {
			name = strings.Fields(name)[0]
			if (strings.HasPrefix(name, "KUBE-") || strings.HasPrefix(name, "CNI-")) && !old[name] {
				mine[name] = true
				chains = append(chains, name)
			}
		}
	}
	for _, line := range lines {
		rest, ok := strings.CutPrefix(line, "-A ")
		if !ok {
			continue
		}
		args := splitQuoted(rest)
		if len(args) == 0 || mine[args[0]] {
			continue
		}
		for i := 0; i+1 < len(args); i++ {
			if (args[i] == "-j" || args[i] == "-g") && mine[args[i+1]] {
				jumps = append(jumps, args)
				break
			}
		}
	}
	return chains, jumps
}

// splitQuoted splits an iptables-save rule into arguments ("..." quotes a comment).
func splitQuoted(s string) []string {
	var args []string
	var cur strings.Builder
	quoted, started := false, false
	for i := 0; i < len(s); i++ {
		switch ch := s[i]; {
		case ch == '\\' && quoted && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
		case ch == '"':
			quoted, started = !quoted, true
		case ch == ' ' && !quoted:
			if started {
				args = append(args, cur.String())
				cur.Reset()
				started = false
			}
		default:
			cur.WriteByte(ch)
			started = true
		}
	}
	if started {
		args = append(args, cur.String())
	}
	return args
}

func run(name string, args ...string) error {
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
