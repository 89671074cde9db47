// Package host is what a local node changes on its machine beyond its data
// folder, claimed before the node starts and restored after it stopped.
// kubelet, containerd and the CNI plugins use fixed host paths, mounts,
// cgroups, a bridge, iptables rules and sysctls; the record of what was there
// before is kept in StateFile while the node runs, so a node that died
// without cleaning up is cleaned up by the next claim.
package host

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

// The machine's one node lock and the record of the host as it was.
const (
	RunDir    = "/run/kubelock-dev"
	LockFile  = RunDir + "/node.lock"
	StateFile = RunDir + "/node.json"
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

// Node is what the node's own configuration puts on the host.
type Node struct {
	// Dir is the node's data folder, removed at the end.
	Dir string `json:"nodeDir"`
	// MountRoots: every mount under them is the node's (the kubelet's root,
	// containerd's folders, netns).
	MountRoots []string `json:"mountRoots"`
	// Shim is the shim binary whose processes are the node's (the real path:
	// a shim's /proc/<pid>/exe is one).
	Shim string `json:"shim"`
	// KubeProxy cleans up its rules (kube-proxy --cleanup).
	KubeProxy string `json:"kubeProxy"`
	// Bridge is the CNI bridge, deleted at the end.
	Bridge string `json:"bridge"`
}

// state is the host as the claim found it, with the node that changes it.
type state struct {
	Node
	// Created are the fixedHostPaths this node created.
	Created []string `json:"created"`
	// Sysctls are the values before, by /proc/sys path.
	Sysctls map[string]string `json:"sysctls"`
	// Chains are the KUBE-* and CNI-* iptables chains there before, by
	// command and table: the others, and the rules jumping to them, are the node's.
	Chains map[string][]string `json:"chains"`
}

// Host is the machine claimed for one node: Restore puts it back.
type Host struct {
	lock     *os.File
	state    *state
	progress func(format string, args ...any)
}

// Claim takes the machine's one node lock, cleans up after an earlier node
// that died, and records the host as it is now for node. progress, when
// set, hears what it cleans up.
func Claim(node Node, progress func(format string, args ...any)) (*Host, error) {
	if progress == nil {
		progress = func(string, ...any) {}
	}
	if err := os.MkdirAll(RunDir, 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(LockFile, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("another kubelock-dev --node runs on this machine (it holds %s): one node per machine", LockFile)
	}
	h := &Host{lock: f, progress: progress}
	if err := h.cleanUpEarlier(); err != nil {
		_ = h.unlock()
		return nil, err
	}
	if h.state, err = record(node); err != nil {
		_ = h.unlock()
		return nil, err
	}
	return h, nil
}

// cleanUpEarlier restores the host an earlier node recorded and left.
func (h *Host) cleanUpEarlier() error {
	var old state
	if data, err := os.ReadFile(StateFile); err == nil && json.Unmarshal(data, &old) == nil {
		h.progress("cleaning up the host state an earlier --node run left")
		if err := old.cleanup(); err != nil {
			return fmt.Errorf("cleaning up after an earlier --node run: %w", err)
		}
	}
	return nil
}

// record writes down, in StateFile, the host as it is before node runs.
func record(node Node) (*state, error) {
	s := &state{Node: node, Sysctls: map[string]string{}, Chains: map[string][]string{}}
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
		return nil, err
	}
	return s, os.WriteFile(StateFile, data, 0o600)
}

// Restore puts the host back as Claim found it (the node's processes have
// stopped) and frees the node lock.
func (h *Host) Restore() error {
	if h.lock == nil {
		return nil
	}
	err := h.state.cleanup()
	if err == nil {
		err = os.Remove(StateFile)
	}
	err = errors.Join(err, h.unlock())
	if err == nil {
		h.progress("host state cleaned up")
	}
	return err
}

// unlock frees the node lock and the run folder when empty.
func (h *Host) unlock() error {
	_ = os.Remove(LockFile)
	err := h.lock.Close() // and with it the lock
	_ = os.Remove(RunDir)
	h.lock = nil
	return err
}

// cleanup kills the node's containers and shims, unmounts, removes the pods'
// cgroups, the bridge, kube-proxy's iptables rules and the paths the node
// created, and restores the sysctls.
func (s *state) cleanup() error {
	var errs []error
	KillContainers(s.Shim)
	errs = append(errs, s.unmount())
	errs = append(errs, removeCgroups("kubepods"))
	if s.Bridge != "" {
		if out, err := exec.Command("ip", "link", "del", s.Bridge).CombinedOutput(); err != nil && !strings.Contains(string(out), "Cannot find") {
			errs = append(errs, fmt.Errorf("deleting bridge %s: %w: %s", s.Bridge, err, out))
		}
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
	for _, p := range append(append([]string(nil), s.Created...), s.Dir) {
		if p != "" {
			errs = append(errs, os.RemoveAll(p))
		}
	}
	for k, v := range s.Sysctls {
		errs = append(errs, os.WriteFile(filepath.Join("/proc/sys", k), []byte(v+"\n"), 0o644))
	}
	return errors.Join(errs...)
}

// KillContainers kills the node's containers (they hold mounts and cgroups),
// then its shims, the processes of shim: after the node's own processes
// stopped, and before the control plane, whose apiserver would wait for
// their watches.
func KillContainers(shim string) {
	for i := 0; i < 50 && killAll(shim) > 0; i++ {
		time.Sleep(100 * time.Millisecond)
	}
}

// killAll SIGKILLs the processes in the pods' cgroups and the node's shims
// and returns how many it found.
func killAll(shim string) int {
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
	if len(pids) == 0 && shim != "" {
		procs, _ := os.ReadDir("/proc")
		for _, p := range procs {
			if pid, err := strconv.Atoi(p.Name()); err == nil {
				if exe, err := os.Readlink(filepath.Join("/proc", p.Name(), "exe")); err == nil && exe == shim {
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
func (s *state) unmount() error {
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
func (s *state) removeChains() error {
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
