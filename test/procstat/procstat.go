// Package procstat reads a process's name and CPU time from Linux's
// /proc/PID/stat, for the benchmarks' and the fault suite's CPU reports.
package procstat

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ClockTicks is USER_HZ, the unit of /proc's CPU times: 100 on every Linux
// architecture Go runs on.
const ClockTicks = 100

// Read returns the command name of process pid and its CPU time (user and
// system) in clock ticks.
func Read(pid int) (comm string, ticks uint64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", 0, err
	}
	return parse(b)
}

// parse reads a /proc/PID/stat line. The command name is in parentheses
// and may hold spaces and parentheses itself, so the fields are counted
// from the last ')': state is field 3, utime and stime fields 14 and 15.
func parse(b []byte) (comm string, ticks uint64, err error) {
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return "", 0, fmt.Errorf("procstat: no command name in %q", b)
	}
	f := strings.Fields(string(b[end+1:]))
	if len(f) < 13 {
		return "", 0, fmt.Errorf("procstat: %d fields after the command name, want 13 or more", len(f))
	}
	u, err := strconv.ParseUint(f[11], 10, 64)
	if err != nil {
		return "", 0, fmt.Errorf("procstat: utime: %w", err)
	}
	s, err := strconv.ParseUint(f[12], 10, 64)
	if err != nil {
		return "", 0, fmt.Errorf("procstat: stime: %w", err)
	}
	return string(b[open+1 : end]), u + s, nil
}
