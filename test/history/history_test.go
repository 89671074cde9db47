package history

import (
	"fmt"
	"strings"
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

func TestHoldingLearnedAfterItsDeadlineIsNotOrdered(t *testing.T) {
	// a's acquire (token 5, safe deadline 100) returns only at 400, after a
	// pause; b held the lock meanwhile with token 7. a never held it.
	h := cat(acq("a", 1, 0, 400, "k", "r1", "L1", 5, 100), acq("b", 1, 150, 200, "k", "r2", "L2", 7, 300))
	if vs := CheckHoldings(Holdings(h)); len(vs) > 0 {
		t.Fatalf("an empty holding must not be ordered: %v", vs)
	}
	// The same late return inside b's confirmed interval with a live deadline is I1.
	h = cat(acq("a", 1, 0, 250, "k", "r1", "L1", 5, 500), acq("b", 1, 150, 200, "k", "r2", "L2", 7, 300))
	if vs := CheckHoldings(Holdings(h)); len(vs) == 0 {
		t.Fatal("want a violation for a holding confirmed while another was")
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

// What the model-based test (test/integration) used to check itself.
func TestSwappedTokensAreI2(t *testing.T) {
	h := cat(acq("a", 1, 0, 10, "k", "r1", "L1", 7, 0), rel("a", 2, 20, 30, "k", "L1"), acq("b", 1, 25, 40, "k", "r2", "L2", 5, 0))
	if vs := CheckHoldings(Holdings(h)); len(vs) != 1 || vs[0].Invariant != "I2" {
		t.Fatalf("want one I2 violation, got %v", vs)
	}
}

// read is one observer's read of key k sent at sent and answered at t: the
// ended holdings, oldest first, then the holder (lease "" when free).
func read(t, sent int64, status int64, lease, req string, ended ...Event) []Event {
	var out []Event
	for _, e := range ended {
		e.Op, e.Phase, e.Key, e.T = OpServer, Point, "k", t
		out = append(out, e)
	}
	return append(out, Event{Op: OpServer, Phase: Return, Key: "k", Lease: lease, Req: req, Token: status, Deadline: sent, T: t})
}

func TestStoredAndClientsAgree(t *testing.T) {
	clients := cat(acq("a", 1, 0, 10, "k", "r1", "L1", 5, 0), rel("a", 2, 20, 30, "k", "L1"), acq("b", 1, 25, 40, "k", "r2", "L2", 7, 0))
	for _, tc := range []struct {
		name string
		evs  []Event
		want []string // invariants violated
	}{
		{"agreeing reads", cat(clients, read(12, 11, 5, "L1", "r1"), read(33, 31, 5, "", ""), read(50, 45, 7, "L2", "r2", Event{Lease: "L1", Req: "r1", Token: 5})), nil},
		{"a read during a holding finds the lock free", cat(clients, read(15, 11, 5, "", "")), []string{"I1"}},
		{"a read during a holding finds another holder", cat(clients, read(50, 45, 9, "L9", "r9")), []string{"I1"}},
		{"stored tokens do not grow", cat(clients, read(50, 45, 7, "L2", "r2", Event{Lease: "L0", Req: "r0", Token: 8})), []string{"I2"}},
		{"a holding first seen later has a lower token", cat(clients, read(50, 45, 7, "L2", "r2"), read(60, 55, 7, "L2", "r2", Event{Lease: "L0", Req: "r0", Token: 6})), []string{"I2"}},
		{"a read answered late shows an older holding than one answered before it", cat(clients, read(45, 42, 7, "L2", "r2"), read(50, 11, 5, "L1", "r1")), nil},
		{"the stored token is not the client's", cat(clients, read(50, 45, 8, "L2", "r2")), []string{"I2"}},
		{"the stored request ID is not the client's", cat(clients, read(50, 45, 7, "L2", "r1")), []string{"I6", "I6"}},
	} {
		var got []string
		vs := CheckHoldings(Holdings(tc.evs))
		vs = append(vs, CheckRequestIDs(tc.evs)...)
		vs = append(vs, CheckStored(tc.evs, Holdings(tc.evs))...)
		for _, v := range vs {
			got = append(got, v.Invariant)
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, vs, tc.want)
		}
	}
}

// shared is a shared acquisition of key k on slot, as its client recorded it.
func shared(proc string, id, call, ret int64, key, req, lease string, slot int32, token, deadline int64) []Event {
	evs := acq(proc, id, call, ret, key, req, lease, token, deadline)
	evs[0].Shared, evs[0].Permits = true, 2
	evs[1].Shared, evs[1].Slot = true, slot
	return evs
}

func invariants(vs []Violation) string {
	var out []string
	for _, v := range vs {
		out = append(out, v.Invariant)
	}
	return fmt.Sprint(out)
}

func TestSharedHoldings(t *testing.T) {
	for _, tc := range []struct {
		name string
		evs  []Event
		want string
	}{
		{"readers on different slots overlap, their tokens in any order", cat(
			shared("a", 1, 0, 10, "k", "r1", "L1", 0, 7, 100), shared("b", 1, 0, 20, "k", "r2", "L2", 1, 5, 100),
		), "[]"},
		{"a writer after the readers", cat(
			shared("a", 1, 0, 10, "k", "r1", "L1", 0, 5, 100), shared("b", 1, 0, 20, "k", "r2", "L2", 1, 6, 100),
			rel("a", 2, 30, 31, "k", "L1"), rel("b", 2, 40, 41, "k", "L2"), acq("c", 1, 35, 50, "k", "r3", "L3", 7, 200),
		), "[]"},
		{"a writer together with a reader", cat(
			shared("a", 1, 0, 10, "k", "r1", "L1", 0, 5, 100), acq("c", 1, 35, 50, "k", "r3", "L3", 7, 200),
		), "[I1]"},
		{"a reader together with the writer, with a lower token", cat(
			acq("c", 1, 0, 10, "k", "r3", "L3", 7, 200), shared("a", 1, 0, 50, "k", "r1", "L1", 0, 5, 100),
		), "[I1 I2]"},
		{"one slot, two holders", cat(
			shared("a", 1, 0, 10, "k", "r1", "L1", 1, 5, 100), shared("b", 1, 0, 20, "k", "r2", "L2", 1, 6, 100),
		), "[I1]"},
		{"one slot, a token that does not rise", cat(
			shared("a", 1, 0, 10, "k", "r1", "L1", 1, 6, 100), rel("a", 2, 30, 31, "k", "L1"), shared("b", 1, 32, 40, "k", "r2", "L2", 1, 5, 100),
		), "[I2]"},
	} {
		if got := invariants(CheckHoldings(Holdings(tc.evs))); got != tc.want {
			t.Errorf("%s: got %s, want %s: %v", tc.name, got, tc.want, CheckHoldings(Holdings(tc.evs)))
		}
	}
}

func TestPermits(t *testing.T) {
	two := map[string]int{"k": 2}
	for _, tc := range []struct {
		name string
		evs  []Event
		want string
	}{
		{"two of two, then a hand-over at the same instant", cat(
			shared("a", 1, 0, 10, "k", "r1", "L1", 0, 5, 100), shared("b", 1, 0, 20, "k", "r2", "L2", 1, 6, 100),
			rel("a", 2, 30, 31, "k", "L1"), shared("c", 1, 25, 30, "k", "r3", "L3", 0, 7, 100),
		), "[]"},
		{"three of two", cat(
			shared("a", 1, 0, 10, "k", "r1", "L1", 0, 5, 100), shared("b", 1, 0, 20, "k", "r2", "L2", 1, 6, 100),
			shared("c", 1, 25, 30, "k", "r3", "L3", 0, 7, 100),
		), "[I1]"},
		{"a slot out of range", shared("a", 1, 0, 10, "k", "r1", "L1", 2, 5, 100), "[I1]"},
		{"another key is not counted", cat(
			shared("a", 1, 0, 10, "x", "r1", "L1", 0, 5, 100), shared("b", 1, 0, 20, "x", "r2", "L2", 1, 6, 100),
			shared("c", 1, 25, 30, "x", "r3", "L3", 2, 7, 100),
		), "[]"},
	} {
		if got := invariants(CheckPermits(Holdings(tc.evs), two)); got != tc.want {
			t.Errorf("%s: got %s, want %s: %v", tc.name, got, tc.want, CheckPermits(Holdings(tc.evs), two))
		}
	}
}

// sharedRead is one observer's read of k sent at sent and answered at t,
// showing the ended holdings, then the shared holdings, then no holder.
func sharedRead(t, sent, status int64, ended []Event, held ...Event) []Event {
	out := read(t, sent, status, "", "", ended...)
	summary := out[len(out)-1]
	out = out[:len(out)-1]
	for _, e := range held {
		e.Op, e.Phase, e.Key, e.T, e.Shared = OpServer, Return, "k", t, true
		out = append(out, e)
	}
	return append(out, summary)
}

func TestSharedStoredHistory(t *testing.T) {
	clients := cat(shared("a", 1, 0, 10, "k", "r1", "L1", 0, 5, 100), shared("b", 1, 0, 20, "k", "r2", "L2", 1, 6, 100))
	for _, tc := range []struct {
		name string
		evs  []Event
		want string
	}{
		{"agreeing reads", cat(clients, sharedRead(25, 21, 6, nil, Event{Lease: "L1", Req: "r1", Token: 5}, Event{Lease: "L2", Req: "r2", Token: 6, Slot: 1})), "[]"},
		{"readers that ended in another order than their tokens", cat(clients,
			rel("a", 2, 30, 31, "k", "L1"), rel("b", 2, 28, 29, "k", "L2"),
			sharedRead(40, 35, 6, []Event{{Lease: "L2", Req: "r2", Token: 6, Shared: true, Slot: 1}, {Lease: "L1", Req: "r1", Token: 5, Shared: true}})), "[]"},
		{"one slot's holdings that ended in another order than their tokens", cat(
			shared("a", 1, 0, 10, "k", "r1", "L1", 1, 5, 12), shared("b", 1, 15, 20, "k", "r2", "L2", 1, 6, 40),
			sharedRead(50, 45, 6, []Event{{Lease: "L2", Req: "r2", Token: 6, Shared: true, Slot: 1}, {Lease: "L1", Req: "r1", Token: 5, Shared: true, Slot: 1}})), "[I2]"},
		{"a read during a reader's holding that misses it", cat(clients, sharedRead(25, 21, 6, nil, Event{Lease: "L2", Req: "r2", Token: 6, Slot: 1})), "[I1]"},
		{"the stored slot is not the client's", cat(clients, sharedRead(25, 21, 6, nil, Event{Lease: "L1", Req: "r1", Token: 5, Slot: 3}, Event{Lease: "L2", Req: "r2", Token: 6, Slot: 1})), "[I2]"},
	} {
		hs := Holdings(tc.evs)
		vs := CheckHoldings(hs)
		vs = append(vs, CheckRequestIDs(tc.evs)...)
		vs = append(vs, CheckStored(tc.evs, hs)...)
		if got := invariants(vs); got != tc.want {
			t.Errorf("%s: got %s, want %s: %v", tc.name, got, tc.want, vs)
		}
	}
}

// The fault suite's histories with shared holdings become the shared model's operations.
func TestSharedOperationsAreLinearizable(t *testing.T) {
	ok := cat(shared("a", 1, 0, 10, "k", "r1", "L1", 0, 5, 100), shared("b", 1, 0, 20, "k", "r2", "L2", 1, 6, 100),
		sharedRead(25, 21, 6, nil, Event{Lease: "L1", Req: "r1", Token: 5}, Event{Lease: "L2", Req: "r2", Token: 6, Slot: 1}))
	if res, _, n := CheckLinearizable(ok, 0); res != porcupine.Ok || n != 3 {
		t.Fatalf("want 3 operations, linearizable: %d, %s", n, res)
	}
	third := cat(ok, shared("c", 1, 30, 40, "k", "r3", "L3", 0, 7, 100))
	if res, _, _ := CheckLinearizable(third, 0); res != porcupine.Illegal {
		t.Fatalf("a third permit of two must not be linearizable, got %s", res)
	}
	missed := cat(shared("a", 1, 0, 10, "k", "r1", "L1", 0, 5, 100), shared("b", 1, 0, 20, "k", "r2", "L2", 1, 6, 100),
		sharedRead(25, 21, 6, nil, Event{Lease: "L1", Req: "r1", Token: 5}))
	if res, _, _ := CheckLinearizable(missed, 0); res != porcupine.Illegal {
		t.Fatalf("a read that misses a permit must not be linearizable, got %s", res)
	}
}

// failedRel is a release invoked at call whose write the apiserver refused
// (a 403 while its RBAC informers sync after a restart): it returned an error
// at ret, and the holding stayed stored for the controller to expire.
func failedRel(proc string, id, call, ret int64, key, lease string) []Event {
	return []Event{
		{Proc: proc, Op: OpRelease, Phase: Invoke, ID: id, T: call, Key: key, Lease: lease},
		{Proc: proc, Op: OpRelease, Phase: Return, ID: id, T: ret, Key: key, Lease: lease, Outcome: Failed, Err: "forbidden"},
	}
}

// The soak's soak-7 in a coordinator run: a release refused with 403 right
// after the apiserver came back, the holding still stored after the release
// returned, then expired by the controller after the holder's safe deadline.
func TestFailedReleaseLeavesTheHoldingToTheController(t *testing.T) {
	base := cat(acq("a", 1, 0, 10, "k", "r1", "L1", 5, 100), failedRel("a", 2, 20, 60, "k", "L1"),
		read(70, 65, 5, "L1", "r1"))
	expired := cat(base, read(150, 140, 5, "", "", Event{Lease: "L1", Req: "r1", Token: 5, Reason: "Expired"}),
		acq("b", 1, 160, 170, "k", "r2", "L2", 9, 300), read(180, 175, 9, "L2", "r2", Event{Lease: "L1", Req: "r1", Token: 5, Reason: "Expired"}))
	if res, _, _ := CheckLinearizable(expired, 0); res != porcupine.Ok {
		t.Fatalf("an expiry after the safe deadline of a holding whose release failed is correct, got %s", res)
	}
	hs := Holdings(expired)
	if vs := append(CheckHoldings(hs), CheckStored(expired, hs)...); len(vs) > 0 {
		t.Fatal(vs)
	}
	// Still an early expiry: free before the holder's safe deadline, after a
	// read showed the failed release had not committed.
	early := cat(base, read(85, 80, 5, "", "", Event{Lease: "L1", Req: "r1", Token: 5, Reason: "Expired"}))
	if res, _, _ := CheckLinearizable(early, 0); res != porcupine.Illegal {
		t.Fatalf("an expiry before the safe deadline must stay illegal, got %s", res)
	}
	// And a holder that failed to release it before anybody's acquisition
	// within its safe deadline.
	taken := cat(base, acq("b", 1, 75, 90, "k", "r2", "L2", 9, 300))
	if res, _, _ := CheckLinearizable(taken, 0); res != porcupine.Illegal {
		t.Fatalf("an acquisition within the safe deadline must stay illegal, got %s", res)
	}
}

// An acquire whose write committed while its answer was lost, and whose
// holding the controller ended before the call's retry read found it in
// recentAcquisitions: the call returns ErrLockLost (I6: "says that lease is
// already over"), and reads saw the holding meanwhile.
func TestAcquireLostAfterItsOwnHoldingEnded(t *testing.T) {
	h := []Event{
		{Proc: "a", Op: OpAcquire, Phase: Invoke, ID: 1, T: 0, Key: "k", Req: "r1"},
		{Proc: "a", Op: OpAcquire, Phase: Return, ID: 1, T: 200, Key: "k", Req: "r1", Outcome: Lost, Err: "lease L1 (token 5) already ended: Expired by controller"},
	}
	h = cat(h, read(60, 50, 5, "L1", "r1"), read(160, 150, 5, "", "", Event{Lease: "L1", Req: "r1", Token: 5, Reason: "Expired"}))
	if res, _, _ := CheckLinearizable(h, 0); res != porcupine.Ok {
		t.Fatalf("a call told its own holding already ended had that holding, got %s", res)
	}
	// But not while another holding lasts: it never committed then.
	held := cat(acq("b", 1, 0, 10, "k", "r2", "L2", 4, 1000), h[:2], read(60, 50, 5, "L1", "r1"))
	if res, _, _ := CheckLinearizable(held, 0); res != porcupine.Illegal {
		t.Fatalf("a holding while another's lasts must stay illegal, got %s", res)
	}
}

func TestExplainIllegalSaysWhere(t *testing.T) {
	// a's release failed; the lock was free before its safe deadline (100).
	h := cat(acq("a", 1, 0, 10, "k", "r1", "L1", 5, 100), failedRel("a", 2, 20, 60, "k", "L1"),
		read(70, 65, 5, "L1", "r1"), read(85, 80, 5, "", ""), acq("b", 1, 300, 310, "k2", "r2", "L2", 9, 400))
	stuck := ExplainIllegal(h, 0)
	if len(stuck) != 1 || stuck[0].Key != "k" {
		t.Fatalf("want key k stuck, got %+v", stuck)
	}
	sum := stuck[0].Summary()
	for _, want := range []string{"key k: the lock is held by L1, token 5", "Observe(k) -> free", "Release(L1) -> error (forbidden)"} {
		if !strings.Contains(sum, want) {
			t.Errorf("summary %q lacks %q", sum, want)
		}
	}
	if rep := stuck[0].Report(5); !strings.Contains(rep, "none of these can come next") {
		t.Errorf("report: %s", rep)
	}
}
