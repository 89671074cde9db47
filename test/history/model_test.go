package history

import (
	"testing"

	"github.com/anishathalye/porcupine"
)

// The specification itself must reject the histories the tests are there to
// catch. The operations are the model-based test's (test/integration).
func TestModelSpecification(t *testing.T) {
	op := func(client int, in Input, out Output, call, ret int64) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Input: in, Output: out, Call: call, Return: ret}
	}
	acq := func(c int, req, lease string, token, call, ret int64) porcupine.Operation {
		return op(c, Input{Kind: KindAcquire, Req: req, Try: true}, Output{Outcome: OK, Lease: lease, Token: token}, call, ret)
	}
	rel := func(c int, lease string, call, ret int64) porcupine.Operation {
		return op(c, Input{Kind: KindRelease, Lease: lease}, Output{Outcome: OK}, call, ret)
	}
	retry := func(lease string, out Output, call, ret int64) porcupine.Operation {
		return op(0, Input{Kind: KindAcquire, Req: "a", Retry: true, OrigLease: lease}, out, call, ret)
	}
	crash := op(0, Input{Kind: KindCrash, Lease: "L1"}, Output{}, 11, 12)
	for _, tc := range []struct {
		name string
		ops  []porcupine.Operation
		want bool
	}{
		{"a hand-over, a retry, and an expiry after the holder's Done", []porcupine.Operation{
			acq(0, "a", "L1", 10, 0, 10),
			op(1, Input{Kind: KindAcquire, Req: "b", Try: true}, Output{Outcome: Locked, Lease: "L1", Req: "a"}, 11, 12),
			retry("L1", Output{Outcome: OK, Lease: "L1", Token: 10}, 13, 14),
			op(0, Input{Kind: KindCrash, Lease: "L1"}, Output{}, 15, 16),
			op(0, Input{Kind: KindAbandon, Lease: "L1"}, Output{}, 17, 18),
			acq(1, "c", "L2", 12, 19, 20),
			retry("L1", Output{Outcome: Lost}, 21, 22),
			rel(1, "L2", 23, 24),
			op(2, Input{Kind: KindObserve}, Output{Outcome: OK, Token: 12}, 25, 26),
		}, true},
		{"a release told its holding was lost: expired while the release's write was on its way", []porcupine.Operation{
			acq(0, "a", "L1", 10, 0, 10),
			op(0, Input{Kind: KindRelease, Lease: "L1"}, Output{Outcome: Lost}, 11, 16),
			acq(1, "b", "L2", 12, 12, 14),
		}, true},
		{"a holding taken from its holder before the holder's release began (I5)", []porcupine.Operation{
			acq(0, "a", "L1", 10, 0, 10),
			acq(1, "b", "L2", 12, 11, 12),
			op(0, Input{Kind: KindRelease, Lease: "L1"}, Output{Outcome: Lost}, 13, 14),
		}, false},
		{"two holders (I1)", []porcupine.Operation{acq(0, "a", "L1", 10, 0, 10), acq(1, "b", "L2", 11, 11, 12)}, false},
		{"a token that does not grow (I2)", []porcupine.Operation{acq(0, "a", "L1", 10, 0, 10), rel(0, "L1", 11, 12), acq(1, "b", "L2", 10, 13, 14)}, false},
		{"an expiry before the holder's Done (I5)", []porcupine.Operation{
			acq(0, "a", "L1", 10, 0, 10), crash, acq(1, "b", "L2", 12, 13, 14),
			op(0, Input{Kind: KindAbandon, Lease: "L1"}, Output{}, 15, 16),
		}, false},
		{"a retry that returns another lease (I6)", []porcupine.Operation{acq(0, "a", "L1", 10, 0, 10), retry("L1", Output{Outcome: OK, Lease: "L9", Token: 11}, 11, 12)}, false},
		{"a retry that says a live holding ended (I6)", []porcupine.Operation{acq(0, "a", "L1", 10, 0, 10), retry("L1", Output{Outcome: Lost}, 11, 12)}, false},
		{"a retry that returns a released holding (I6)", []porcupine.Operation{acq(0, "a", "L1", 10, 0, 10), rel(0, "L1", 11, 12), retry("L1", Output{Outcome: OK, Lease: "L1", Token: 10}, 13, 14)}, false},
	} {
		if got := porcupine.CheckOperations(Model(), tc.ops); got != tc.want {
			t.Errorf("%s: linearizable %v, want %v", tc.name, got, tc.want)
		}
	}
}

// The same specification for shared holdings: an RWMutex's readers (Limit
// 1024) and writer, a Semaphore's permits (Limit = permits), each on a slot.
func TestSharedModelSpecification(t *testing.T) {
	op := func(client int, in Input, out Output, call, ret int64) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Input: in, Output: out, Call: call, Return: ret}
	}
	const rw = 1024
	read := func(c int, limit int, req, lease string, slot int32, token, call, ret int64) porcupine.Operation {
		return op(c, Input{Kind: KindAcquire, Req: req, Try: true, Shared: true, Limit: limit}, Output{Outcome: OK, Lease: lease, Slot: slot, Token: token}, call, ret)
	}
	write := func(c int, req, lease string, token, call, ret int64) porcupine.Operation {
		return op(c, Input{Kind: KindAcquire, Req: req, Try: true}, Output{Outcome: OK, Lease: lease, Token: token}, call, ret)
	}
	rel := func(c int, lease string, call, ret int64) porcupine.Operation {
		return op(c, Input{Kind: KindRelease, Lease: lease}, Output{Outcome: OK}, call, ret)
	}
	abandon := func(c int, lease string, call, ret int64) porcupine.Operation {
		return op(c, Input{Kind: KindAbandon, Lease: lease}, Output{}, call, ret)
	}
	observe := func(holder string, token, call, ret int64, shared ...Seen) porcupine.Operation {
		return op(9, Input{Kind: KindObserve}, Output{Outcome: OK, Lease: holder, Req: holder, Token: token, Shared: shared}, call, ret)
	}
	for _, tc := range []struct {
		name string
		ops  []porcupine.Operation
		want bool
	}{
		{"readers together, then a writer", []porcupine.Operation{
			read(0, rw, "a", "R1", 0, 10, 0, 10), read(1, rw, "b", "R2", 1, 11, 5, 12),
			observe("", 11, 13, 14, Seen{"R1", "a", 0, 10}, Seen{"R2", "b", 1, 11}),
			rel(0, "R1", 15, 16), rel(1, "R2", 17, 18), write(2, "c", "W1", 12, 19, 20),
		}, true},
		{"a writer while a reader holds", []porcupine.Operation{read(0, rw, "a", "R1", 0, 10, 0, 10), write(1, "b", "W1", 11, 11, 12)}, false},
		{"a reader while the writer holds", []porcupine.Operation{write(0, "a", "W1", 10, 0, 10), read(1, rw, "b", "R1", 0, 11, 11, 12)}, false},
		{"a reader's token that does not rise", []porcupine.Operation{read(0, rw, "a", "R1", 0, 10, 0, 10), read(1, rw, "b", "R2", 1, 9, 11, 12)}, false},
		{"a read that misses a reader", []porcupine.Operation{read(0, rw, "a", "R1", 0, 10, 0, 10), read(1, rw, "b", "R2", 1, 11, 11, 12), observe("", 11, 13, 14, Seen{"R1", "a", 0, 10})}, false},
		{"a read that shows a reader on another slot", []porcupine.Operation{read(0, rw, "a", "R1", 0, 10, 0, 10), observe("", 10, 13, 14, Seen{"R1", "a", 3, 10})}, false},
		{"a crashed reader expires after its Done, then a writer", []porcupine.Operation{
			read(0, rw, "a", "R1", 0, 10, 0, 10), read(1, rw, "b", "R2", 1, 11, 11, 12),
			op(0, Input{Kind: KindCrash, Lease: "R1"}, Output{}, 13, 14), abandon(0, "R1", 15, 16),
			observe("", 11, 17, 18, Seen{"R2", "b", 1, 11}), rel(1, "R2", 19, 20), write(2, "c", "W1", 12, 21, 22),
		}, true},
		{"a writer before the crashed reader's Done (I5)", []porcupine.Operation{
			read(0, rw, "a", "R1", 0, 10, 0, 10), op(0, Input{Kind: KindCrash, Lease: "R1"}, Output{}, 11, 12),
			write(1, "b", "W1", 12, 13, 14), abandon(0, "R1", 15, 16),
		}, false},
		{"a timed-out reader whose write committed", []porcupine.Operation{
			read(0, rw, "a", "R1", 0, 10, 0, 10),
			op(1, Input{Kind: KindAcquire, Req: "b", Shared: true, Limit: rw}, Output{Outcome: Timeout}, 11, 12),
			observe("", 14, 13, 14, Seen{"R1", "a", 0, 10}, Seen{"R9", "b", 1, 14}),
			read(2, rw, "c", "R3", 2, 15, 15, 16),
		}, true},
		{"a reader queued behind readers, with a waiter", []porcupine.Operation{
			read(0, rw, "a", "R1", 0, 10, 0, 10),
			op(1, Input{Kind: KindAcquire, Req: "b", Try: true, Shared: true, Limit: rw, QueueMaybe: true}, Output{Outcome: Locked, Queued: true}, 11, 12),
		}, true},
		{"a reader queued behind the writer with no waiter", []porcupine.Operation{
			write(0, "a", "W1", 10, 0, 10),
			op(1, Input{Kind: KindAcquire, Req: "b", Try: true, Shared: true, Limit: rw, QueueMaybe: true}, Output{Outcome: Locked, Queued: true}, 11, 12),
		}, false},
		{"a writer told two readers hold", []porcupine.Operation{
			read(0, rw, "a", "R1", 0, 10, 0, 10), read(1, rw, "b", "R2", 1, 11, 0, 10),
			op(2, Input{Kind: KindAcquire, Req: "c", Try: true}, Output{Outcome: Locked, SharedHeld: 2}, 11, 12),
		}, true},
		{"a writer told one reader holds when two do", []porcupine.Operation{
			read(0, rw, "a", "R1", 0, 10, 0, 10), read(1, rw, "b", "R2", 1, 11, 0, 10),
			op(2, Input{Kind: KindAcquire, Req: "c", Try: true}, Output{Outcome: Locked, SharedHeld: 1}, 11, 12),
		}, false},
		{"a reader told readers hold, with no waiter", []porcupine.Operation{
			read(0, rw, "a", "R1", 0, 10, 0, 10),
			op(2, Input{Kind: KindAcquire, Req: "c", Try: true, Shared: true, Limit: rw}, Output{Outcome: Locked, SharedHeld: 1}, 11, 12),
		}, false},
		{"a reader told a released reader holds", []porcupine.Operation{
			read(0, rw, "a", "R1", 0, 10, 0, 10), rel(0, "R1", 11, 12),
			op(1, Input{Kind: KindAcquire, Req: "b", Try: true, Shared: true, Limit: rw}, Output{Outcome: Locked, Lease: "R1", Req: "a"}, 13, 14),
		}, false},
		{"a reader's retry returns its lease", []porcupine.Operation{
			read(0, rw, "a", "R1", 0, 10, 0, 10),
			op(1, Input{Kind: KindAcquire, Req: "a", Retry: true, OrigLease: "R1", Shared: true, Limit: rw}, Output{Outcome: OK, Lease: "R1", Slot: 0, Token: 10}, 11, 12),
			rel(0, "R1", 13, 14),
			op(1, Input{Kind: KindAcquire, Req: "a", Retry: true, OrigLease: "R1", Shared: true, Limit: rw}, Output{Outcome: Lost}, 15, 16),
		}, true},

		{"two permits of two, one released, a third", []porcupine.Operation{
			read(0, 2, "a", "P1", 0, 10, 0, 10), read(1, 2, "b", "P2", 1, 11, 5, 12),
			rel(0, "P1", 13, 14), read(2, 2, "c", "P3", 0, 12, 15, 16),
		}, true},
		{"a third permit of two", []porcupine.Operation{read(0, 2, "a", "P1", 0, 10, 0, 10), read(1, 2, "b", "P2", 1, 11, 5, 12), read(2, 2, "c", "P3", 2, 12, 15, 16)}, false},
		{"a full semaphore", []porcupine.Operation{
			read(0, 2, "a", "P1", 0, 10, 0, 10), read(1, 2, "b", "P2", 1, 11, 5, 12),
			op(2, Input{Kind: KindAcquire, Req: "c", Try: true, Shared: true, Limit: 2}, Output{Outcome: Locked, SharedHeld: 2}, 13, 14),
		}, true},
		{"a slot collision", []porcupine.Operation{read(0, 2, "a", "P1", 0, 10, 0, 10), read(1, 2, "b", "P2", 0, 11, 11, 12)}, false},
		{"a slot out of range", []porcupine.Operation{read(0, 2, "a", "P1", 2, 10, 0, 10)}, false},
		{"a freed slot's next token that does not rise", []porcupine.Operation{
			read(0, 2, "a", "P1", 0, 10, 0, 10), read(1, 2, "b", "P2", 1, 11, 5, 12), rel(0, "P1", 13, 14), read(2, 2, "c", "P3", 0, 11, 15, 16),
		}, false},
		{"a permit freed by an expiry after its holder's Done", []porcupine.Operation{
			read(0, 2, "a", "P1", 0, 10, 0, 10), read(1, 2, "b", "P2", 1, 11, 5, 12),
			abandon(0, "P1", 13, 14), read(2, 2, "c", "P3", 0, 12, 15, 16),
		}, true},
		{"a permit taken before the lost holder's Done (I5)", []porcupine.Operation{
			read(0, 2, "a", "P1", 0, 10, 0, 10), read(1, 2, "b", "P2", 1, 11, 5, 12),
			read(2, 2, "c", "P3", 0, 12, 13, 14), abandon(0, "P1", 15, 16),
		}, false},
		{"a timed-out permit whose write committed, and no room for another", []porcupine.Operation{
			read(0, 2, "a", "P1", 0, 10, 0, 10),
			op(1, Input{Kind: KindAcquire, Req: "b", Shared: true, Limit: 2}, Output{Outcome: Timeout}, 11, 12),
			read(2, 2, "c", "P3", 1, 14, 13, 14),
			observe("", 14, 15, 16, Seen{"P1", "a", 0, 10}, Seen{"P3", "c", 1, 14}, Seen{"P9", "b", 2, 13}),
		}, false},
		{"of two lost permits one expired", []porcupine.Operation{
			read(0, 2, "a", "P1", 0, 10, 0, 10), read(1, 2, "b", "P2", 1, 11, 5, 12),
			abandon(0, "P1", 13, 14), abandon(1, "P2", 13, 14),
			observe("", 11, 15, 16, Seen{"P2", "b", 1, 11}), read(2, 2, "c", "P3", 0, 12, 17, 18),
		}, true},
	} {
		if got := porcupine.CheckOperations(Model(), tc.ops); got != tc.want {
			t.Errorf("%s: linearizable %v, want %v", tc.name, got, tc.want)
		}
	}
}
