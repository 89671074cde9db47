package cli

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"unicode"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
)

func TestPrintfAndRow(t *testing.T) {
	var b bytes.Buffer
	printf(&b, "held by %s (%v) token %d: %v\n", "a\x1b[2Jb", errors.New("boom\x07"), 7, stringer("x\u202ey"))
	printRow(&b, "  ", "one\ttwo", "three\n")
	want := "held by a\\x1b[2Jb (boom\\x07) token 7: x\\u202ey\n  one\\x09two\tthree\\x0a\n"
	if b.String() != want {
		t.Errorf("got %q, want %q", b.String(), want)
	}
}

type stringer string

func (s stringer) String() string { return string(s) }

func TestOneLineEscapes(t *testing.T) {
	err := errors.New("kubelock: lock jobs is held by \x1b]0;pwned\x07evil\u202e (user bob)\nnext")
	got := oneLine(err)
	want := `kubelock: lock jobs is held by \x1b]0;pwned\x07evil\u202e (user bob) next`
	if got != want {
		t.Errorf("oneLine = %q, want %q", got, want)
	}
}

// hostile is a lock whose every name another writer could choose carries
// escape sequences; the table and describe views show none of them raw.
func hostile() locksv1alpha1.DistributedLock {
	l := fixtures()[0]
	const esc = "\x1b[2J\x1b]0;owned\x07"
	key := "orders" + esc + "\u202e"
	l.Name, _ = lock.NameForKey(key)
	l.Annotations = map[string]string{locksv1alpha1.KeyAnnotation: key}
	h := l.Status.Holder
	h.Identity, h.User, h.PodName, h.LeaseID, h.RequestID = "worker"+esc, "bob\r\nforged", "pod\u200b", "lease\t1", "req\x00"
	l.Status.Waiters[0].Identity, l.Status.Waiters[0].User, l.Status.Waiters[0].RequestID = "w\x1b[31m", "u\u2028", "r\x7f"
	f := &l.Status.RecentAcquisitions[1]
	f.Identity, f.EndedBy, f.LeaseID, f.Message = "old\x1bc", "oncall\u202e", "id\x9b", "stuck\x1b[1A\x1b[2K job"
	l.Status.Conditions[0].Message = "held by worker" + esc
	return l
}

func TestHostileNamesAreEscapedInTables(t *testing.T) {
	l := hostile()
	events := []corev1.Event{{Type: corev1.EventTypeNormal, Reason: "Acquired\x1b[8m", Message: "acquired by worker\x1b]0;x\x07",
		ReportingController: "ctl\u202e", EventTime: metav1.NewMicroTime(now.Add(-1))}}
	var b bytes.Buffer
	if err := printLockTable(&b, []locksv1alpha1.DistributedLock{l}, now, true); err != nil {
		t.Fatal(err)
	}
	if err := describeLock(&b, &l, lockDetails{events: events}, now); err != nil {
		t.Fatal(err)
	}
	if err := describeLock(&b, &l, lockDetails{eventsNote: "<cannot list events: \x1b[5m>"}, now); err != nil {
		t.Fatal(err)
	}
	if err := printLeases(&b, "table", []leaseView{{Name: "n\x1b", LeaseID: "l\u202e", ExpiresAt: now}}, now); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, r := range out {
		if r != '\n' && (unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp)) {
			t.Fatalf("output holds %U raw:\n%s", r, out)
		}
	}
	for _, want := range []string{`worker\x1b[2J\x1b]0;owned\x07`, `orders\x1b[2J\x1b]0;owned\x07\u202e`, `bob\x0d\x0aforged`,
		`pod\u200b`, `lease\x091`, `req\x00`, `w\x1b[31m`, `u\u2028`, `r\x7f`, `old\x1bc`, `oncall\u202e`, `id\x9b`,
		`stuck\x1b[1A\x1b[2K job`, `Acquired\x1b[8m`, `acquired by worker\x1b]0;x\x07`, `ctl\u202e`, `<cannot list events: \x1b[5m>`,
		`n\x1b`, `l\u202e`} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %s:\n%s", want, out)
		}
	}
	golden(t, "describe_hostile.golden", func() []byte {
		var d bytes.Buffer
		_ = describeLock(&d, &l, lockDetails{events: events}, now)
		return d.Bytes()
	}())
}

// TestHostileSharedHoldersAreEscaped: every name in a shared holding and a
// waiter of a Semaphore is written by some lock user; none prints raw.
func TestHostileSharedHoldersAreEscaped(t *testing.T) {
	l := semaphore()
	const esc = "\x1b]0;owned\x07"
	h := &l.Status.SharedHolders[0]
	h.Identity, h.User, h.PodName, h.LeaseID, h.Session = "reader"+esc, "eve\r\nforged", "pod\u202e", "lease\x00", "s\u2029"
	l.Status.Waiters[0].Identity = "w\x1b[8m"
	var b bytes.Buffer
	if err := printLockTable(&b, []locksv1alpha1.DistributedLock{l}, now, false); err != nil {
		t.Fatal(err)
	}
	if err := describeLock(&b, &l, lockDetails{}, now); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, r := range out {
		if r != '\n' && (unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp)) {
			t.Fatalf("output holds %U raw:\n%s", r, out)
		}
	}
	for _, want := range []string{`reader\x1b]0;owned\x07`, `eve\x0d\x0aforged`, `pod\u202e`, `lease\x00`, `s\u2029`, `w\x1b[8m`} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %s:\n%s", want, out)
		}
	}
}

// TestLongStringsAreCut: a key annotation of a lock another user created
// is bounded only by the apiserver (256 kB on an administrator's lock); the
// table and describe views show a key only when it is this lock's, so one
// longer than any key (1,024 bytes) is not shown, and the views stay small.
func TestLongStringsAreCut(t *testing.T) {
	l := fixtures()[0]
	l.Annotations = map[string]string{locksv1alpha1.KeyAnnotation: "orders-" + strings.Repeat("\u00e9", 100<<10)}
	var b bytes.Buffer
	if err := printLockTable(&b, []locksv1alpha1.DistributedLock{l}, now, true); err != nil {
		t.Fatal(err)
	}
	if err := describeLock(&b, &l, lockDetails{}, now); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if strings.Contains(out, "\u00e9") || !strings.Contains(out, "Key:               "+l.Name) {
		t.Fatalf("the views show a key annotation that is no key of this lock:\n%.300s", out)
	}
	if len(out) > 4*maxShown {
		t.Fatalf("%d bytes of output for one lock", len(out))
	}
}
