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
