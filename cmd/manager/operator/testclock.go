//go:build faults

package operator

import (
	"os"
	"strings"
	"sync"
	"time"
	"unsafe"

	"k8s.io/utils/clock"
)

// WallClockOffsetFileEnv names a file holding a duration (e.g. "1h") by which
// the controller's wall clock is shifted. It exists for the fault-injection
// suite (test/e2e/faults) only: it simulates an operator whose system clock
// jumps, which LD_PRELOAD-style fake-time tools cannot do for a Go binary.
// Only the wall reading moves; Go's monotonic reading, which the controller
// uses for every duration it measures, stays what the kernel says, exactly
// as on a host whose clock was set. The file is read again on every Now, so
// a test can make the clock jump while the manager runs. Unset in production.
const WallClockOffsetFileEnv = "KUBELOCK_TESTING_WALL_CLOCK_OFFSET_FILE"

// testingClock returns the shifted clock when WallClockOffsetFileEnv is set, else nil.
func testingClock() clock.PassiveClock {
	path := os.Getenv(WallClockOffsetFileEnv)
	if path == "" {
		return nil
	}
	return &wallOffsetClock{path: path}
}

// wallOffsetClock is the real clock with its wall reading shifted by the
// duration in a file.
type wallOffsetClock struct {
	clock.RealClock
	path string

	mu     sync.Mutex
	offset time.Duration
}

func (c *wallOffsetClock) current() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if b, err := os.ReadFile(c.path); err == nil {
		if d, err := time.ParseDuration(strings.TrimSpace(string(b))); err == nil {
			c.offset = d
		}
	}
	return c.offset
}

// Now is the current time with the wall reading shifted.
func (c *wallOffsetClock) Now() time.Time { return shiftWall(time.Now(), c.current()) }

// Since is measured with Now, as the controller would with time.Since.
func (c *wallOffsetClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// timeLayout mirrors time.Time's fields (runtime/time.go: wall, ext, loc).
type timeLayout struct {
	wall uint64
	ext  int64
	loc  *time.Location
}

const (
	hasMonotonic = 1 << 63
	nsecMask     = 1<<30 - 1
	nsecShift    = 30
	secMask      = 1<<33 - 1 // seconds since 1885 while hasMonotonic is set
)

// shiftWall returns t with its wall reading moved by d and its monotonic
// reading unchanged, as a wall-clock step leaves CLOCK_MONOTONIC alone. A time
// without a monotonic reading, or one the shift would move out of the packed
// range, is shifted with Add.
func shiftWall(t time.Time, d time.Duration) time.Time {
	if d == 0 {
		return t
	}
	p := (*timeLayout)(unsafe.Pointer(&t))
	if p.wall&hasMonotonic == 0 {
		return t.Add(d)
	}
	sec := int64(p.wall >> nsecShift & secMask)
	ns := sec*int64(time.Second) + int64(p.wall&nsecMask) + int64(d)
	if ns < 0 || ns/int64(time.Second) > secMask {
		return t.Add(d)
	}
	out := t
	q := (*timeLayout)(unsafe.Pointer(&out))
	q.wall = hasMonotonic | uint64(ns/int64(time.Second))<<nsecShift | uint64(ns%int64(time.Second))
	// The layout is the runtime's; if it ever changes, fall back to Add rather than lie.
	if !out.Round(0).Equal(t.Round(0).Add(d)) || out.Sub(t) != 0 {
		return t.Add(d)
	}
	return out
}
