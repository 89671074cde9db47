package procstat

import (
	"os"
	"testing"
)

func TestParse(t *testing.T) {
	// A command name with a space and a ')' in it, as /proc shows one.
	line := []byte("4242 (a b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 17 5 0 0 20 0 1 0 99 1000 10\n")
	comm, ticks, err := parse(line)
	if err != nil || comm != "a b) c" || ticks != 22 {
		t.Fatalf("parse = %q, %d, %v; want \"a b) c\", 22, nil", comm, ticks, err)
	}
	if _, _, err := parse([]byte("4242 (x) S 1")); err == nil {
		t.Fatal("parse of a short line: no error")
	}
}

func TestReadSelf(t *testing.T) {
	comm, _, err := Read(os.Getpid())
	if err != nil || comm == "" {
		t.Fatalf("Read(self) = %q, %v", comm, err)
	}
}
