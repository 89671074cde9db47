package history

import (
	"testing"

	"github.com/anishathalye/porcupine"
)

func acq(proc string, id, call, ret int64, key, req, lease string, token, deadline int64) []Event {
	return []Event{
		{Proc: proc, Op: OpAcquire, Phase: Invoke, ID: id, T: call, Key: key, Req: req},
		{Proc: proc, Op: OpAcquire, Phase: Return, ID: id, T: ret, Key: key, Req: req, Lease: lease, Token: token, Outcome: OK, Deadline: deadline},
	}
}

func rel(proc string, id, call, ret int64, key, lease string) []Event {
	return []Event{
		{Proc: proc, Op: OpRelease, Phase: Invoke, ID: id, T: call, Key: key, Lease: lease},
		{Proc: proc, Op: OpRelease, Phase: Return, ID: id, T: ret, Key: key, Lease: lease, Outcome: OK},
	}
}

func cat(parts ...[]Event) []Event {
	var out []Event
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func TestCleanHandOverPasses(t *testing.T) {
	h := cat(acq("a", 1, 0, 10, "k", "r1", "L1", 5, 100), rel("a", 2, 20, 30, "k", "L1"), acq("b", 1, 25, 40, "k", "r2", "L2", 7, 200), rel("b", 2, 50, 60, "k", "L2"))
	if vs := CheckHoldings(Holdings(h)); len(vs) > 0 {
		t.Fatal(vs)
	}
	if res, _, _ := CheckLinearizable(h, 0); res != porcupine.Ok {
		t.Fatalf("linearizability: %s", res)
	}
}

func TestOverlapAndTokenOrderAreViolations(t *testing.T) {
	h := cat(acq("a", 1, 0, 10, "k", "r1", "L1", 5, 100), acq("b", 1, 20, 30, "k", "r2", "L2", 4, 200))
	vs := CheckHoldings(Holdings(h))
	if len(vs) != 2 || vs[0].Invariant != "I1" || vs[1].Invariant != "I2" {
		t.Fatalf("want I1 and I2, got %v", vs)
	}
	if res, _, _ := CheckLinearizable(h, 0); res != porcupine.Illegal {
		t.Fatalf("two holders at once must not be linearizable, got %s", res)
	}
}

func TestEarlyExpiryIsNotLinearizable(t *testing.T) {
	// a's safe deadline is 100; b acquires (after an expiry) and returns at 50.
	early := cat(acq("a", 1, 0, 10, "k", "r1", "L1", 5, 100), []Event{{Proc: "suite", Op: OpKill, T: 20}}, acq("b", 1, 30, 50, "k", "r2", "L2", 9, 300))
	early[2].Proc = "a"
	if res, _, _ := CheckLinearizable(early, 0); res != porcupine.Illegal {
		t.Fatalf("an acquisition before the killed holder's deadline must be illegal, got %s", res)
	}
	late := cat(acq("a", 1, 0, 10, "k", "r1", "L1", 5, 100), []Event{{Proc: "a", Op: OpKill, T: 20}}, acq("b", 1, 30, 150, "k", "r2", "L2", 9, 300))
	if res, _, _ := CheckLinearizable(late, 0); res != porcupine.Ok {
		t.Fatalf("an acquisition after the deadline is fine, got %s", res)
	}
}

func TestRequestIDAndFence(t *testing.T) {
	h := cat(acq("a", 1, 0, 10, "k", "r1", "L1", 5, 100), acq("b", 1, 0, 10, "k", "r1", "L2", 6, 100))
	if vs := CheckRequestIDs(h); len(vs) != 1 {
		t.Fatalf("want one I6 violation, got %v", vs)
	}
	hs := Holdings(cat(acq("a", 1, 0, 10, "k", "r1", "L1", 5, 100), acq("b", 1, 200, 210, "k", "r2", "L2", 6, 300)))
	if vs := CheckFence([]Write{{Key: "k", Token: 5}, {Key: "k", Token: 6}, {Key: "k", Token: 6}}, hs); len(vs) > 0 {
		t.Fatal(vs)
	}
	if vs := CheckFence([]Write{{Key: "k", Token: 6}, {Key: "k", Token: 5}}, hs); len(vs) != 1 {
		t.Fatalf("want one I7 violation, got %v", vs)
	}
}
