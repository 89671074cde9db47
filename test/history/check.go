package history

import (
	"fmt"
	"math"
	"sort"
)

// Holding is one acquisition as its client(s) saw it: from the return of the
// acquire that reported it to the first moment its holder could no longer
// prove it (release sent, Done fired, process killed, or the last safe
// deadline it recorded, whichever came first).
type Holding struct {
	Key, Lease, Req string
	Procs           []string
	Token           int64
	Start, End      int64
	// Ended says why End is what it is: release, lost, kill, deadline or open.
	Ended string
}

// Holdings derives the confirmed holdings from a history.
func Holdings(events []Event) []Holding {
	byLease := map[string]*Holding{}
	var order []string
	deadline := map[string]int64{} // lease -> last recorded safe deadline
	type end struct {
		t   int64
		why string
	}
	ends := map[string]end{} // lease -> earliest explicit end
	openBy := map[string][]string{}
	setEnd := func(lease string, t int64, why string) {
		if e, ok := ends[lease]; !ok || t < e.t {
			ends[lease] = end{t, why}
		}
	}
	for _, e := range sorted(events) {
		switch {
		case e.Op == OpAcquire && e.Phase == Return && e.Outcome == OK:
			h, ok := byLease[e.Lease]
			if !ok {
				h = &Holding{Key: e.Key, Lease: e.Lease, Req: e.Req, Token: e.Token, Start: e.T}
				byLease[e.Lease] = h
				order = append(order, e.Lease)
			}
			h.Procs = append(h.Procs, e.Proc)
			openBy[e.Proc] = append(openBy[e.Proc], e.Lease)
			if e.Deadline > deadline[e.Lease] {
				deadline[e.Lease] = e.Deadline
			}
		case e.Op == OpDeadline:
			if e.Deadline > deadline[e.Lease] {
				deadline[e.Lease] = e.Deadline
			}
		case e.Op == OpRelease && e.Phase == Invoke:
			setEnd(e.Lease, e.T, "release")
		case e.Op == OpLost:
			setEnd(e.Lease, e.T, "lost")
		case e.Op == OpKill:
			for _, l := range openBy[e.Proc] {
				setEnd(l, e.T, "kill")
			}
		}
	}
	out := make([]Holding, 0, len(order))
	for _, l := range order {
		h := *byLease[l]
		h.End, h.Ended = math.MaxInt64, "open"
		if e, ok := ends[l]; ok {
			h.End, h.Ended = e.t, e.why
		}
		if d, ok := deadline[l]; ok && d < h.End {
			h.End, h.Ended = d, "deadline"
		}
		out = append(out, h)
	}
	return out
}

// Violation is one broken invariant, with the evidence.
type Violation struct {
	Invariant string
	Detail    string
}

func (v Violation) String() string { return v.Invariant + ": " + v.Detail }

// CheckHoldings checks I1 (confirmed intervals of different holdings of one
// key never overlap) and I2 (tokens strictly increase in hold order).
func CheckHoldings(hs []Holding) []Violation {
	var vs []Violation
	byKey := map[string][]Holding{}
	for _, h := range hs {
		byKey[h.Key] = append(byKey[h.Key], h)
	}
	for key, list := range byKey {
		sort.Slice(list, func(i, j int) bool { return list[i].Start < list[j].Start })
		for i := 1; i < len(list); i++ {
			prev, cur := list[i-1], list[i]
			if cur.Start < prev.End {
				vs = append(vs, Violation{"I1", fmt.Sprintf("key %s: holding %s (token %d, %v) confirmed at %d while %s (token %d, %v) was confirmed until %d (%s), overlap %.3fs",
					key, cur.Lease, cur.Token, cur.Procs, cur.Start, prev.Lease, prev.Token, prev.Procs, prev.End, prev.Ended, float64(prev.End-cur.Start)/1e9)})
			}
			if cur.Token <= prev.Token {
				vs = append(vs, Violation{"I2", fmt.Sprintf("key %s: holding %s got token %d after holding %s had token %d", key, cur.Lease, cur.Token, prev.Lease, prev.Token)})
			}
		}
	}
	return vs
}

// CheckRequestIDs checks I6: every request ID is tied to at most one lease,
// counting what clients were told and what observers saw stored.
func CheckRequestIDs(events []Event) []Violation {
	leases := map[string]map[string]bool{}
	for _, e := range events {
		if e.Req == "" || e.Lease == "" {
			continue
		}
		if (e.Op == OpAcquire && e.Phase == Return && e.Outcome == OK) || e.Op == OpServer {
			if leases[e.Key+"/"+e.Req] == nil {
				leases[e.Key+"/"+e.Req] = map[string]bool{}
			}
			leases[e.Key+"/"+e.Req][e.Lease] = true
		}
	}
	var vs []Violation
	for req, ls := range leases {
		if len(ls) > 1 {
			vs = append(vs, Violation{"I6", fmt.Sprintf("request %s produced %d holdings: %v", req, len(ls), ls)})
		}
	}
	return vs
}

// Write is one write the protected resource accepted, in commit order.
type Write struct {
	Key   string
	Token int64
	Proc  string
	Seq   int64
}

// CheckFence checks I7 on the resource's own record: every accepted write of a
// key carries a token at least the highest accepted before, and only tokens
// some client was granted.
func CheckFence(writes []Write, hs []Holding) []Violation {
	granted := map[string]map[int64]bool{}
	for _, h := range hs {
		if granted[h.Key] == nil {
			granted[h.Key] = map[int64]bool{}
		}
		granted[h.Key][h.Token] = true
	}
	var vs []Violation
	highest := map[string]int64{}
	for _, w := range writes {
		if w.Token < highest[w.Key] {
			vs = append(vs, Violation{"I7", fmt.Sprintf("key %s: write %d of %s with token %d accepted after token %d", w.Key, w.Seq, w.Proc, w.Token, highest[w.Key])})
		}
		highest[w.Key] = max(highest[w.Key], w.Token)
		if !granted[w.Key][w.Token] {
			vs = append(vs, Violation{"I7", fmt.Sprintf("key %s: write %d of %s carries token %d that no acquire returned", w.Key, w.Seq, w.Proc, w.Token)})
		}
	}
	return vs
}

func sorted(events []Event) []Event {
	out := append([]Event(nil), events...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].T < out[j].T })
	return out
}
