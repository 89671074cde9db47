//go:build faults

package operator

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestShiftWallKeepsMonotonicReading(t *testing.T) {
	now := time.Now()
	for _, d := range []time.Duration{time.Hour, -time.Hour, 90 * time.Minute, 1500 * time.Millisecond} {
		got := shiftWall(now, d)
		if want := now.Round(0).Add(d); !got.Round(0).Equal(want) {
			t.Errorf("shift %s: wall %s, want %s", d, got.Round(0), want)
		}
		if s := got.Sub(now); s != 0 {
			t.Errorf("shift %s: monotonic difference %s, want 0", d, s)
		}
	}
	if got, want := shiftWall(now.Round(0), time.Hour), now.Round(0).Add(time.Hour); !got.Equal(want) {
		t.Errorf("without a monotonic reading: %s, want %s", got, want)
	}
}

func TestWallOffsetClockReadsTheFileOnEveryNow(t *testing.T) {
	path := filepath.Join(t.TempDir(), "offset")
	c := &wallOffsetClock{path: path}
	before := time.Now()
	if d := c.Now().Round(0).Sub(before.Round(0)); d < 0 || d > time.Minute {
		t.Fatalf("no file: wall moved by %s", d)
	}
	if err := os.WriteFile(path, []byte("2h\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	n := c.Now()
	if d := n.Round(0).Sub(before.Round(0)); d < 2*time.Hour || d > 2*time.Hour+time.Minute {
		t.Fatalf("after the jump the wall moved by %s, want about 2h", d)
	}
	if d := n.Sub(before); d < 0 || d > time.Minute {
		t.Fatalf("after the jump the monotonic clock moved by %s, want about 0", d)
	}
	if d := c.Since(before); d > time.Minute {
		t.Fatalf("Since measured %s across a wall jump", d)
	}
}
