package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/kubelock/kubelock/pkg/lock"
)

func TestExitCode(t *testing.T) {
	gr := schema.GroupResource{Group: "locks.kubelock.io", Resource: "distributedlocks"}
	refused := &url.Error{Op: "Get", URL: "https://127.0.0.1:1/api", Err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}
	cases := []struct {
		name string
		err  error
		want int
	}{
		{"nil", nil, ExitOK},
		{"lost", fmt.Errorf("acquire: %w", lock.ErrLockLost), ExitLockLost},
		{"locked", &lock.LockedError{Name: "x"}, ExitNotAcquired},
		{"timeout", fmt.Errorf("acquire: %w (last error: boom)", lock.ErrTimeout), ExitNotAcquired},
		{"queue full", lock.ErrQueueFull, ExitNotAcquired},
		{"the lock object too large for etcd", fmt.Errorf("%w: acquire \"k\": etcdserver: request is too large", lock.ErrTooLarge), ExitNotAcquired},
		{"mode the type lacks", fmt.Errorf("%w: acquire \"x\": lock x is a Mutex, which cannot be held Shared", lock.ErrMode), ExitUsage},
		{"not found", fmt.Errorf("%w: default/x", lock.ErrNotFound), ExitNotFound},
		{"api not found", apierrors.NewNotFound(gr, "x"), ExitNotFound},
		{"forbidden", apierrors.NewForbidden(gr, "x", errors.New("no")), ExitDenied},
		{"unauthorized", apierrors.NewUnauthorized("who"), ExitDenied},
		{"admission", admissionDenial(gr), ExitDenied},
		{"invalid (the CRD's rules)", crdDenial(gr), ExitDenied},
		{"unavailable", apierrors.NewServiceUnavailable("etcd"), ExitUnreachable},
		{"refused", fmt.Errorf("learning the user: %w", refused), ExitUnreachable},
		{"usage", usageErrorf("bad"), ExitUsage},
		{"explicit", withCode(3, nil), 3},
		{"other", errors.New("boom"), ExitError},
		// Timeouts of pkg/lock are "not acquired", not "unreachable", though both wrap deadlines.
		{"lock timeout wraps deadline", lock.ErrTimeout, ExitNotAcquired},
		{"canceled", context.Canceled, ExitError},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := exitCode(tc.err); got != tc.want {
				t.Errorf("exitCode(%v) = %d, want %d", tc.err, got, tc.want)
			}
		})
	}
}

func TestOneLine(t *testing.T) {
	err := fmt.Errorf("%w: shop/jobs\nmore", lock.ErrNotFound)
	got := oneLine(err)
	want := `kubelock: lock not found: shop/jobs more`
	if got != want {
		t.Errorf("oneLine = %q, want %q", got, want)
	}
}

func TestArgumentErrorsNeedNoServer(t *testing.T) {
	cases := []struct {
		args []string
		want int
		msg  string
	}{
		{[]string{"bogus"}, ExitUsage, "unknown command"},
		{[]string{"get", "--bogus"}, ExitUsage, "unknown flag"},
		{[]string{"acquire", ""}, ExitUsage, "must not be empty"},
		{[]string{"acquire", strings.Repeat("k", 1025)}, ExitUsage, "limit is 1024"},
		{[]string{"acquire", "x", "--wait", "2h"}, ExitUsage, "--wait 2h0m0s is outside"},
		{[]string{"acquire", "x", "--lease", "1500ms"}, ExitUsage, "whole seconds"},
		{[]string{"get", "x", "-o", "xml"}, ExitUsage, "unknown output format"},
		{[]string{"release", "x"}, ExitUsage, "--lease-id is required"},
		{[]string{"force-release", "x"}, ExitUsage, "--reason is required"},
		{[]string{"run", "x", "true"}, ExitUsage, "KEY -- CMD"},
		{[]string{"probe", "ready"}, ExitUsage, "expected readyz or healthz"},
		{[]string{"probe"}, ExitUsage, "expected readyz or healthz"},
		{[]string{"agent", "--listen", "0.0.0.0:8477"}, ExitUsage, "listens on a loopback address only"},
		{[]string{"agent", "--listen", ":8477"}, ExitUsage, "listens on a loopback address only"},
		{[]string{"agent", "--listen", "localhost:8477"}, ExitUsage, "listens on a loopback address only"},
		{[]string{"agent", "--listen", "127.0.0.1"}, ExitUsage, "missing port"},
		{[]string{"agent", "--session-ttl", "3s"}, ExitUsage, "--session-ttl must be whole seconds"},
		{[]string{"run", "x", "--", "/does/not/exist"}, ExitCommandNotFound, "no such file"},
		{[]string{"get", "x", "--kubeconfig", filepath.Join(os.TempDir(), "kubelock-missing-kubeconfig")}, ExitUsage, "no usable Kubernetes configuration"},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errOut strings.Builder
			code := Run(context.Background(), append([]string{"kubelock"}, tc.args...), genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
			if code != tc.want {
				t.Errorf("exit code %d, want %d (stderr %q)", code, tc.want, errOut.String())
			}
			lines := strings.Split(strings.TrimSuffix(errOut.String(), "\n"), "\n")
			if len(lines) != 1 || !strings.Contains(lines[0], tc.msg) {
				t.Errorf("stderr = %q, want one line containing %q", errOut.String(), tc.msg)
			}
		})
	}
}

func TestWriteTokenFileReplaces(t *testing.T) {
	path := filepath.Join(t.TempDir(), "jobs", "token")
	for _, tok := range []int64{41, 4711} {
		if err := writeTokenFile(path, tok); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := string(b), fmt.Sprintf("%d\n", tok); got != want {
			t.Errorf("token file = %q, want %q", got, want)
		}
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("temporary files left behind: %v", entries)
	}
}

func admissionDenial(gr schema.GroupResource) error {
	return apierrors.NewForbidden(gr, "x", errors.New(`admission webhook "vdistributedlock.kubelock.io" denied the request: `+
		`status.holder: Forbidden: [kubelock:holder-only] only the holder's user may release it`))
}

func crdDenial(gr schema.GroupResource) error {
	return apierrors.NewInvalid(schema.GroupKind{Group: gr.Group, Kind: "DistributedLock"}, "x", field.ErrorList{
		field.Invalid(field.NewPath("status", "holder", "leaseDurationSeconds"), 600, "must not exceed spec.maxLeaseDurationSeconds"),
	})
}

func TestSidecarPermanent(t *testing.T) {
	gr := schema.GroupResource{Group: "locks.kubelock.io", Resource: "distributedlocks"}
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"usage", usageErrorf("bad"), true},
		{"not found", fmt.Errorf("%w: default/x", lock.ErrNotFound), true},
		{"RBAC", apierrors.NewForbidden(gr, "x", errors.New(`User "u" cannot update resource "distributedlocks/status"`)), true},
		{"unauthorized", apierrors.NewUnauthorized("who"), true},
		{"admission rule", fmt.Errorf("acquire: %w", admissionDenial(gr)), false},
		{"CRD rule", fmt.Errorf("acquire: %w", crdDenial(gr)), false},
		{"unreachable", apierrors.NewServiceUnavailable("etcd"), false},
		{"other", errors.New("boom"), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := permanent(tc.err); got != tc.want {
				t.Errorf("permanent(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

func TestGraceUntil(t *testing.T) {
	cases := []struct {
		name     string
		grace    time.Duration
		leaseEnd time.Duration // from now
		want     time.Duration // from now
	}{
		{"grace first", 10 * time.Second, time.Minute, 10 * time.Second},
		{"lease first", time.Hour, 3 * time.Second, 3 * time.Second},
		{"lease already over", 10 * time.Second, -time.Second, 0},
		{"no grace", 0, time.Minute, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := graceUntil(now, tc.grace, now.Add(tc.leaseEnd)); !got.Equal(now.Add(tc.want)) {
				t.Errorf("graceUntil = now%+v, want now%+v", got.Sub(now), tc.want)
			}
		})
	}
}
