//go:build faults

package faults

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kubelock/kubelock/test/history"
	"github.com/kubelock/kubelock/test/procstat"
)

// Where the machine's CPU went: every process's CPU time (/proc/PID/stat)
// and the machine's (/proc/stat), read once a second while the phases run,
// so the report can say which process took the cores when a span was slow
// (a rejoining member, an apiserver refilling its caches, the operator).

// cpuSample is one reading: when, the machine's busy and total ticks, and
// each process's ticks by PID.
type cpuSample struct {
	at                 int64
	busy, steal, total uint64
	procs              map[int]procTicks
}

type procTicks struct {
	name  string
	ticks uint64
}

// cpuSampler reads a cpuSample every second until stopped.
type cpuSampler struct {
	mu       sync.Mutex
	samples  []cpuSample
	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
}

func startCPUSampler() *cpuSampler {
	s := &cpuSampler{stop: make(chan struct{}), done: make(chan struct{})}
	names := map[string]string{}
	go func() {
		defer close(s.done)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			smp := readCPU(names)
			s.mu.Lock()
			s.samples = append(s.samples, smp)
			s.mu.Unlock()
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// Stop ends the sampling and returns the samples; it may be called again.
func (s *cpuSampler) Stop() []cpuSample {
	s.stopOnce.Do(func() { close(s.stop) })
	<-s.done
	return s.samples
}

// readCPU reads the machine's and every process's CPU time; names caches
// the name of each PID and command.
func readCPU(names map[string]string) cpuSample {
	smp := cpuSample{at: history.Mono(), procs: map[int]procTicks{}}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		// user nice system idle iowait irq softirq steal; guest time is
		// in user and nice already.
		if f := strings.Fields(line); len(f) >= 9 {
			for i, v := range f[1:9] {
				n, _ := strconv.ParseUint(v, 10, 64)
				smp.total += n
				switch i {
				case 3, 4: // idle, iowait
				case 7:
					smp.steal += n // the host ran someone else
				default:
					smp.busy += n
				}
			}
		}
	}
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid, _ := strconv.Atoi(filepath.Base(d))
		comm, ticks, err := procstat.Read(pid)
		if err != nil {
			continue // gone
		}
		key := strconv.Itoa(pid) + " " + comm // an exec (nice → etcd) changes it
		name, ok := names[key]
		if !ok {
			name = processName(pid, comm)
			names[key] = name
		}
		smp.procs[pid] = procTicks{name: name, ticks: ticks}
	}
	return smp
}

// processName is comm, with an etcd member's --name, and the PID.
func processName(pid int, comm string) string {
	if comm == "etcd" {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil {
			for a := range strings.SplitSeq(string(b), "\x00") {
				if v, ok := strings.CutPrefix(a, "--name="); ok {
					comm = v
				}
			}
		}
	}
	return fmt.Sprintf("%s[%d]", comm, pid)
}

// cpuUse is the CPU used between from and to: the machine's busy share of
// all its cores, and each process's share of one core, most first.
type cpuUse struct {
	machine, steal float64
	procs          []procUse
}

type procUse struct {
	name  string
	share float64
}

// cpuBetween sums the samples' intervals that end inside [from, to].
func cpuBetween(samples []cpuSample, from, to int64) cpuUse {
	var busy, steal, total uint64
	by := map[string]uint64{}
	var span int64
	for i := 1; i < len(samples); i++ {
		prev, cur := samples[i-1], samples[i]
		if cur.at <= from || cur.at > to {
			continue
		}
		if prev.total > 0 && cur.total >= prev.total { // both read /proc/stat
			busy, steal, total = busy+cur.busy-prev.busy, steal+cur.steal-prev.steal, total+cur.total-prev.total
		}
		span += cur.at - prev.at
		for pid, p := range cur.procs {
			if was, ok := prev.procs[pid]; ok && p.ticks >= was.ticks {
				by[p.name] += p.ticks - was.ticks
			} else {
				by[p.name] += p.ticks // started in the interval: all of it
			}
		}
	}
	u := cpuUse{}
	if total == 0 || span == 0 {
		return u
	}
	u.machine, u.steal = float64(busy)/float64(total), float64(steal)/float64(total)
	for name, t := range by {
		if t > 0 {
			u.procs = append(u.procs, procUse{name, float64(t) / procstat.ClockTicks / time.Duration(span).Seconds()})
		}
	}
	slices.SortFunc(u.procs, func(a, b procUse) int { return cmp.Compare(b.share, a.share) })
	return u
}

// top is the machine's share and the n busiest processes'.
func (u cpuUse) top(n int) string {
	parts := []string{fmt.Sprintf("machine %.0f %% of %d cores", 100*u.machine, runtime.NumCPU())}
	if u.steal > 0 {
		parts[0] += fmt.Sprintf(" (and %.0f %% stolen by the host)", 100*u.steal)
	}
	for _, p := range u.procs[:min(n, len(u.procs))] {
		parts = append(parts, fmt.Sprintf("%s %.0f %%", p.name, 100*p.share))
	}
	return strings.Join(parts, ", ")
}

// seedCPU is the report's CPU section: each phase's top processes, and the
// machine's share with the top three in each span of the phases (a span too
// short to hold a sample, at a phase's end, is left out).
func seedCPU(phases []seedPhase, samples []cpuSample, span time.Duration) string {
	var b strings.Builder
	for _, ph := range phases {
		fmt.Fprintf(&b, "%s: %s\n", ph.Name, cpuBetween(samples, ph.From, ph.To).top(8))
		for from := ph.From; from < ph.To; from += int64(span) {
			if u := cpuBetween(samples, from, min(from+int64(span), ph.To)); u.procs != nil {
				fmt.Fprintf(&b, "  +%s: %s\n", time.Duration(from-ph.From), u.top(3))
			}
		}
	}
	return b.String()
}
