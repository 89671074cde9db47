package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/cli-runtime/pkg/genericiooptions"
)

// TestMain lets the test binary be run's guard: startGroup starts
// /proc/self/exe, which is this binary here.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == guardCommand {
		os.Exit(runGuard(os.Args[2:], genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}))
	}
	os.Exit(m.Run())
}

func startTestGroup(t *testing.T, script string) *group {
	t.Helper()
	g, err := startGroup("/bin/sh", []string{"sh", "-c", script}, os.Environ(), genericiooptions.IOStreams{In: os.Stdin, Out: os.Stderr, ErrOut: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		g.signal(syscall.SIGKILL)
		g.finish()
	})
	return g
}

func waitExited(t *testing.T, g *group) {
	t.Helper()
	select {
	case <-g.exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the command did not end")
	}
}

func TestGuardReportsTheCommandsExit(t *testing.T) {
	cases := []struct {
		script string
		want   int
	}{
		{"exit 0", ExitOK},
		{"exit 7", 7},
		{"kill -TERM $$", 128 + int(syscall.SIGTERM)},
	}
	for _, tc := range cases {
		t.Run(tc.script, func(t *testing.T) {
			g := startTestGroup(t, tc.script)
			waitExited(t, g)
			if got := exitCode(g.exitCode()); got != tc.want {
				t.Errorf("exit code %d, want %d", got, tc.want)
			}
			if g.alive() {
				t.Error("the group is not empty")
			}
		})
	}
}

func TestGuardForwardedSignalsReachTheGroupNotTheGuard(t *testing.T) {
	dir := t.TempDir()
	g := startTestGroup(t, fmt.Sprintf(`trap 'echo term > %s/term; exit 3' TERM; echo up > %s/up; while :; do sleep 0.05; done`, dir, dir))
	waitFile(t, filepath.Join(dir, "up"))
	g.signal(syscall.SIGTERM)
	waitExited(t, g)
	if got := exitCode(g.exitCode()); got != 3 {
		t.Errorf("exit code %d, want 3", got)
	}
	if syscall.Kill(g.guard, 0) != nil {
		t.Error("the guard is gone before run let it go")
	}
	g.finish()
	if syscall.Kill(g.guard, 0) == nil {
		t.Error("the guard outlived finish")
	}
}

func TestGuardKillsLeftoversWhenLetGo(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "bg.pid")
	g := startTestGroup(t, fmt.Sprintf(`sleep 300 & echo $! > %s; exit 0`, pidFile))
	waitExited(t, g)
	waitFile(t, pidFile)
	if !g.alive() {
		t.Fatal("the background sleep is already gone")
	}
	g.finish()
	waitGone(t, g)
}

func TestGroupIsKilledWhenTheGuardDies(t *testing.T) {
	dir := t.TempDir()
	g := startTestGroup(t, fmt.Sprintf(`sleep 300 & echo up > %s/up; wait`, dir))
	waitFile(t, filepath.Join(dir, "up"))
	if err := syscall.Kill(g.guard, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitExited(t, g)
	if err := g.exitCode(); err == nil || !strings.Contains(err.Error(), "guard died") {
		t.Errorf("exitCode = %v, want the guard's death", err)
	}
	waitGone(t, g)
}

func TestGuardStartErrors(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "not-executable")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := startGroup(path, []string{path}, os.Environ(), genericiooptions.IOStreams{In: os.Stdin, Out: os.Stderr, ErrOut: os.Stderr})
	if err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("startGroup = %v, want permission denied", err)
	}
}

func TestGuardByHandIsAUsageError(t *testing.T) {
	var out strings.Builder
	if code := Run(t.Context(), []string{"kubelock", guardCommand, strconv.Itoa(os.Getpid())}, genericiooptions.IOStreams{Out: &out, ErrOut: &out}); code != ExitUsage {
		t.Errorf("exit code %d, want %d (%s)", code, ExitUsage, out.String())
	}
}

// waitUntil polls cond every 10 ms for up to 10 s.
func waitUntil(t *testing.T, cond func() bool) error {
	t.Helper()
	return wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 10*time.Second, true,
		func(context.Context) (bool, error) { return cond(), nil })
}

func waitFile(t *testing.T, path string) {
	t.Helper()
	if err := waitUntil(t, func() bool {
		b, err := os.ReadFile(path)
		return err == nil && strings.HasSuffix(string(b), "\n")
	}); err != nil {
		t.Fatalf("%s did not appear: %v", path, err)
	}
}

func waitGone(t *testing.T, g *group) {
	t.Helper()
	if err := waitUntil(t, func() bool { return !g.alive() }); err != nil {
		t.Fatalf("the group is still alive: %v", err)
	}
}
