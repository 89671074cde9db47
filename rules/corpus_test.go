package rules

import (
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// corpusShape is one write of the hostile suite's tables, as a predicate on
// a generated write and the webhook's answer.
type corpusShape struct {
	name  string
	match func(w generatedWrite) bool
}

type generatedWrite struct {
	old, new *locksv1alpha1.DistributedLock
	actor    Actor
	d        holdings
	denied   bool
}

func (w generatedWrite) added() *locksv1alpha1.SharedHolder {
	for _, a := range w.d.acquired {
		if a.shared != nil {
			return a.shared
		}
	}
	return nil
}

func (w generatedWrite) is(t locksv1alpha1.LockType) bool { return w.old.LockType() == t }

// sharedShapes are the shapes the corpus of FuzzValidateSharedUpdate must
// hold (test/admission's shared-mode cases, denied and allowed).
var sharedShapes = []corpusShape{
	{"a reader acquiring while a writer holds", func(w generatedWrite) bool {
		return w.is(locksv1alpha1.RWMutex) && w.old.Status.Holder != nil && w.added() != nil
	}},
	{"a writer acquiring while readers hold", func(w generatedWrite) bool {
		return w.is(locksv1alpha1.RWMutex) && len(w.old.Status.SharedHolders) > 0 && w.old.Status.Holder == nil && w.new.Status.Holder != nil
	}},
	{"a permit over the limit", func(w generatedWrite) bool {
		a := w.added()
		return w.is(locksv1alpha1.Semaphore) && a != nil && int(a.Slot) >= w.old.SharedLimit()
	}},
	{"a slot collision", func(w generatedWrite) bool { return refusedByCRD(w.new) && len(w.d.acquired) > 0 }},
	{"a reader's slot out of range", func(w generatedWrite) bool {
		a := w.added()
		return w.is(locksv1alpha1.RWMutex) && a != nil && (a.Slot < 0 || a.Slot >= locksv1alpha1.MaxSharedHolders)
	}},
	{"a forged token on a new entry", func(w generatedWrite) bool {
		a := w.added()
		want, _ := locksv1alpha1.NextFencingToken(w.old.ResourceVersion)
		return a != nil && a.FencingToken != want
	}},
	{"an existing entry's token changed", func(w generatedWrite) bool {
		return slices.ContainsFunc(w.d.kept, func(k keptShared) bool { return k.old.FencingToken != k.new.FencingToken })
	}},
	{"an existing entry moved to another slot", func(w generatedWrite) bool {
		a := w.added()
		return a != nil && slices.ContainsFunc(w.d.ended, func(e ending) bool { return e.h.LeaseID == a.LeaseID })
	}},
	{"one shared holder releasing another's permit", func(w generatedWrite) bool {
		return w.denied && slices.ContainsFunc(w.d.ended, func(e ending) bool { return e.slot != nil && e.h.User != w.actor.Username }) &&
			w.lastReason() == locksv1alpha1.EndReasonReleased
	}},
	{"one shared holder renewing another's permit", func(w generatedWrite) bool {
		return slices.ContainsFunc(w.d.kept, func(k keptShared) bool {
			return k.old.User != w.actor.Username && !k.old.RenewTime.Equal(k.new.RenewTime)
		})
	}},
	{"a writer jumping readers queued before it", func(w generatedWrite) bool {
		ws := w.old.Status.Waiters
		return w.is(locksv1alpha1.RWMutex) && w.old.Status.Holder == nil && w.new.Status.Holder != nil && len(ws) > 0 &&
			ws[0].ModeOrDefault() == locksv1alpha1.Shared && ws[0].RequestID != w.new.Status.Holder.RequestID
	}},
	{"a reader jumping a writer queued before it", func(w generatedWrite) bool {
		ws, a := w.old.Status.Waiters, w.added()
		return a != nil && len(ws) > 0 && ws[0].ModeOrDefault() == locksv1alpha1.Exclusive && ws[0].RequestID != a.RequestID
	}},
	{"two entries added in one write", func(w generatedWrite) bool { return len(w.d.acquired) > 1 }},
	{"an unrecorded removal", func(w generatedWrite) bool {
		return slices.ContainsFunc(w.d.ended, func(e ending) bool { return e.slot != nil }) &&
			len(w.new.Status.RecentAcquisitions) == len(w.old.Status.RecentAcquisitions)
	}},
	{"a non-controller writing Expired for a shared entry", func(w generatedWrite) bool {
		return !w.actor.IsController && slices.ContainsFunc(w.d.ended, func(e ending) bool { return e.slot != nil }) &&
			w.lastReason() == locksv1alpha1.EndReasonExpired
	}},
	{"a shared entry on a Mutex", func(w generatedWrite) bool { return w.is(locksv1alpha1.Mutex) && w.added() != nil }},
	{"an exclusive holder on a Semaphore", func(w generatedWrite) bool {
		return w.is(locksv1alpha1.Semaphore) && w.new.Status.Holder != nil
	}},
	// Left to admission by the CRD (docs/design.md, "The CRD's rules").
	{"a slot's holding replaced by another leaseID in one write", func(w generatedWrite) bool {
		return slices.ContainsFunc(w.d.kept, func(k keptShared) bool { return k.old.LeaseID != k.new.LeaseID })
	}},
	{"a shared holding's lease or pod changed in place", func(w generatedWrite) bool {
		return slices.ContainsFunc(w.d.kept, func(k keptShared) bool {
			return k.old.LeaseID == k.new.LeaseID && (k.old.LeaseDurationSeconds != k.new.LeaseDurationSeconds || k.old.PodUID != k.new.PodUID)
		})
	}},
	{"an acquisition not counted in transitions", func(w generatedWrite) bool {
		return len(w.d.acquired) == 1 && w.new.Status.Transitions != w.old.Status.Transitions+1
	}},
	{"a fresh leaseID reused", func(w generatedWrite) bool {
		a := w.added()
		return a != nil && leaseUsed(&w.old.Status, a.LeaseID)
	}},
	// Found after the shared modes were built.
	{"the head acquiring and staying at the head", func(w generatedWrite) bool {
		return len(w.d.acquired) == 1 && len(w.old.Status.Waiters) > 0 && w.old.Status.Waiters[0].RequestID == w.d.acquired[0].h.RequestID &&
			w.new.Status.WaiterIndex(w.d.acquired[0].h.RequestID) >= 0
	}},
	{"a current holding's requestID reused", func(w generatedWrite) bool {
		return len(w.d.acquired) == 1 && holds(&w.old.Status, func(h *locksv1alpha1.LockHolder) bool { return h.RequestID == w.d.acquired[0].h.RequestID })
	}},
	// The third red team's.
	{"an ended holding's requestID reused", func(w generatedWrite) bool {
		return len(w.d.acquired) == 1 && w.old.Status.FindFinished(w.d.acquired[0].h.RequestID) != nil
	}},
	{"admitted: a reader acquiring beside readers", func(w generatedWrite) bool {
		return !w.denied && w.is(locksv1alpha1.RWMutex) && len(w.old.Status.SharedHolders) > 0 && w.added() != nil
	}},
	{"admitted: a shared head acquiring", func(w generatedWrite) bool {
		return !w.denied && w.added() != nil && len(w.old.Status.Waiters) > 1
	}},
	{"admitted: a release recorded", func(w generatedWrite) bool {
		return !w.denied && w.lastReason() == locksv1alpha1.EndReasonReleased &&
			slices.ContainsFunc(w.d.ended, func(e ending) bool { return e.slot != nil })
	}},
	// Pod fields only from that pod's bound token (actor.go).
	{"a permit in a pod's name taken with a token bound to no pod", func(w generatedWrite) bool {
		a := w.added()
		name, _ := w.actor.pod()
		return a != nil && name == "" && a.PodName != ""
	}},
	{"a permit whose podName is no pod's name", func(w generatedWrite) bool {
		a := w.added()
		return a != nil && a.PodName == badPod
	}},
}

// statusShapes are the shapes the corpus of FuzzValidateStatusUpdate must
// hold: test/admission's pod-field cases, denied and admitted.
var statusShapes = []corpusShape{
	{"a token bound to no pod queueing with a pod's name and UID", func(w generatedWrite) bool {
		return unbound(w.actor) && slices.ContainsFunc(w.addedWaiters(), func(x locksv1alpha1.Waiter) bool {
			return x.PodName != "" && x.PodUID != ""
		})
	}},
	{"a token bound to no pod acquiring in a pod's name", func(w generatedWrite) bool {
		h := w.acquired()
		return unbound(w.actor) && h != nil && h.PodName != ""
	}},
	{"a pod's token queueing in its sibling pod's name and UID", func(w generatedWrite) bool {
		name, _ := w.actor.pod()
		return name == "p0" && slices.ContainsFunc(w.addedWaiters(), func(x locksv1alpha1.Waiter) bool {
			return x.PodName == "p1" && x.PodUID == uidOf("p1")
		})
	}},
	{"a waiter whose podName is no pod's name", func(w generatedWrite) bool {
		return slices.ContainsFunc(w.addedWaiters(), func(x locksv1alpha1.Waiter) bool { return x.PodName == badPod })
	}},
	{"a holding whose podUID is no pod's UID", func(w generatedWrite) bool {
		h := w.acquired()
		return h != nil && h.PodUID != "" && !podUIDRE.MatchString(h.PodUID)
	}},
	// The third red team's: another user's retried acquire would find it.
	{"a waiter with a requestID a holding or record has", func(w generatedWrite) bool {
		return slices.ContainsFunc(w.addedWaiters(), func(x locksv1alpha1.Waiter) bool { return requestUsed(&w.old.Status, x.RequestID) })
	}},
	{"an acquisition with a requestID a record has", func(w generatedWrite) bool {
		h := w.acquired()
		return h != nil && w.old.Status.FindFinished(h.RequestID) != nil
	}},
	{"admitted: a pod queueing in its own name", func(w generatedWrite) bool {
		name, _ := w.actor.pod()
		return !w.denied && name != "" && slices.ContainsFunc(w.addedWaiters(), func(x locksv1alpha1.Waiter) bool { return x.PodName == name })
	}},
	{"admitted: a pod acquiring in its own name", func(w generatedWrite) bool {
		name, _ := w.actor.pod()
		h := w.acquired()
		return !w.denied && name != "" && h != nil && h.PodName == name
	}},
}

func unbound(a Actor) bool {
	name, uid := a.pod()
	return name == "" && uid == ""
}

// addedWaiters are the queue entries the write adds.
func (w generatedWrite) addedWaiters() []locksv1alpha1.Waiter {
	var out []locksv1alpha1.Waiter
	for _, i := range addedWaiters(&w.old.Status, &w.new.Status) {
		out = append(out, w.new.Status.Waiters[i])
	}
	return out
}

// acquired is the one holding the write adds, exclusive or shared; nil if none.
func (w generatedWrite) acquired() *locksv1alpha1.LockHolder {
	if len(w.d.acquired) != 1 {
		return nil
	}
	return w.d.acquired[0].h
}

func (w generatedWrite) lastReason() locksv1alpha1.EndReason {
	r := w.new.Status.RecentAcquisitions
	if len(r) == 0 || len(r) == len(w.old.Status.RecentAcquisitions) && len(w.d.ended) == 0 {
		return ""
	}
	return r[len(r)-1].EndReason
}

// generate decodes fuzz bytes as FuzzValidateSharedUpdate does.
func generate(data []byte) generatedWrite {
	s := &bytesource{b: data}
	oldObj := s.sharedLock()
	newObj := oldObj.DeepCopy()
	return judged(oldObj, newObj, s.actor(s.mutateShared(newObj)))
}

// generateStatus decodes fuzz bytes as FuzzValidateStatusUpdate does.
func generateStatus(data []byte) generatedWrite {
	s := &bytesource{b: data}
	oldObj := s.lock()
	newObj := oldObj.DeepCopy()
	return judged(oldObj, newObj, s.actor(s.mutate(newObj)))
}

func judged(oldObj, newObj *locksv1alpha1.DistributedLock, a Actor) generatedWrite {
	return generatedWrite{old: oldObj, new: newObj, actor: a, d: diffHoldings(&oldObj.Status, &newObj.Status),
		denied: len(ValidateStatusUpdate(oldObj, newObj, a)) > 0}
}

// fuzzCorpus is a fuzz test's corpus and the shapes it must hold.
type fuzzCorpus struct {
	dir      string
	generate func([]byte) generatedWrite
	// engines is the byte in front of a seed that makes FuzzEnginesAgree
	// decode the rest with the same generator.
	engines byte
	shapes  []corpusShape
}

var (
	sharedCorpus = fuzzCorpus{dir: "testdata/fuzz/FuzzValidateSharedUpdate", generate: generate, engines: 1, shapes: sharedShapes}
	statusCorpus = fuzzCorpus{dir: "testdata/fuzz/FuzzValidateStatusUpdate", generate: generateStatus, engines: 0, shapes: statusShapes}
)

// TestSharedFuzzCorpusShapes holds the corpus of FuzzValidateSharedUpdate to
// sharedShapes, and TestStatusFuzzCorpusShapes FuzzValidateStatusUpdate's to
// statusShapes: each shape has a seed. KUBELOCK_WRITE_CORPUS=1 searches
// random inputs for the shapes no seed has and writes one seed per shape,
// also to FuzzEnginesAgree's corpus (there behind the byte that picks the
// same generator).
func TestSharedFuzzCorpusShapes(t *testing.T) { expectCorpusShapes(t, sharedCorpus) }

func TestStatusFuzzCorpusShapes(t *testing.T) { expectCorpusShapes(t, statusCorpus) }

func expectCorpusShapes(t *testing.T, c fuzzCorpus) {
	var seeds [][]byte
	files, _ := filepath.Glob(filepath.Join(c.dir, "*"))
	for _, f := range files {
		seeds = append(seeds, readSeed(t, f))
	}
	var missing []corpusShape
	for _, sh := range c.shapes {
		if !slices.ContainsFunc(seeds, func(b []byte) bool { return sh.match(c.generate(b)) }) {
			missing = append(missing, sh)
		}
	}
	if len(missing) > 0 && os.Getenv("KUBELOCK_WRITE_CORPUS") == "1" {
		missing = writeSeeds(t, c, missing)
	}
	for _, sh := range missing {
		t.Errorf("no seed in %s has the shape %q (KUBELOCK_WRITE_CORPUS=1 writes one)", c.dir, sh.name)
	}
}

func writeSeeds(t *testing.T, c fuzzCorpus, missing []corpusShape) []corpusShape {
	r := rand.New(rand.NewPCG(16, 16))
	for range 2_000_000 {
		if len(missing) == 0 {
			break
		}
		b := make([]byte, 8+r.IntN(56))
		for i := range b {
			b[i] = byte(r.IntN(256))
		}
		w := c.generate(b)
		for i, sh := range missing {
			if sh.match(w) {
				writeSeed(t, c.dir, b)
				writeSeed(t, "testdata/fuzz/FuzzEnginesAgree", append([]byte{c.engines}, b...))
				t.Logf("seed for %q", sh.name)
				missing = slices.Delete(missing, i, i+1)
				break
			}
		}
	}
	return missing
}

func writeSeed(t *testing.T, dir string, b []byte) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("%x", sha256.Sum256(b))[:16]
	if err := os.WriteFile(filepath.Join(dir, name), []byte("go test fuzz v1\n[]byte("+strconv.Quote(string(b))+")\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// readSeed decodes a corpus file of one []byte argument.
func readSeed(t *testing.T, path string) []byte {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 2 || lines[0] != "go test fuzz v1" || !strings.HasPrefix(lines[1], "[]byte(") {
		t.Fatalf("%s: not a corpus file of one []byte", path)
	}
	s, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(lines[1], "[]byte("), ")"))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return []byte(s)
}
