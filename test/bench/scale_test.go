package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/pprof/profile"
)

// TestHeapSummaryByHolder sums a heap profile's in-use bytes by the first
// holder a sample's stack names, the rest as "other", largest first.
func TestHeapSummaryByHolder(t *testing.T) {
	fn := func(id uint64, name string) *profile.Location {
		return &profile.Location{ID: id, Line: []profile.Line{{Function: &profile.Function{ID: id, Name: name}}}}
	}
	decode := fn(1, "k8s.io/client-go/rest/watch.(*Decoder).Decode")
	observe := fn(2, "github.com/kubelock/kubelock/controllers.observe")
	malloc := fn(3, "runtime.mallocgc")
	prof := &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "inuse_objects", Unit: "count"}, {Type: "inuse_space", Unit: "bytes"}},
		Sample: []*profile.Sample{
			{Location: []*profile.Location{malloc, decode}, Value: []int64{1, 6 << 20}},
			// Both holders named: the first in heapHolders' order counts.
			{Location: []*profile.Location{observe, decode}, Value: []int64{1, 2 << 20}},
			{Location: []*profile.Location{observe}, Value: []int64{1, 1 << 20}},
			{Location: []*profile.Location{malloc}, Value: []int64{1, 1 << 20}},
		},
		Location: []*profile.Location{decode, observe, malloc},
	}
	for _, l := range prof.Location {
		prof.Function = append(prof.Function, l.Line[0].Function)
	}
	path := filepath.Join(t.TempDir(), "heap.pprof")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := prof.Write(f); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	// Equal shares in name order, so the line is the same every run.
	want := "decoded locks (the informers' watch decoding) 8 MiB (80%), other 1 MiB (10%), the controller's observations 1 MiB (10%)"
	if got := heapSummary(path); got != want {
		t.Errorf("heapSummary() = %q, want %q", got, want)
	}
	if got := inuse(prof); got != 10<<20 {
		t.Errorf("inuse() = %d, want %d", got, 10<<20)
	}
}
