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
		// A client that learned of its holding only after the holding's safe
		// deadline (it was paused between the commit and the return) never
		// held it: the interval is empty and its late Start says nothing about
		// the order of tokens. CheckStored still checks its token on the server.
		if h.End <= h.Start {
			continue
		}
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
// and every lease to one request ID and one token (so the token a client was
// given is the one stored), counting what clients were told and what
// observers saw stored.
func CheckRequestIDs(events []Event) []Violation {
	leases := map[string]map[string]bool{} // key/req -> leases
	reqs := map[string]map[string]bool{}   // key/lease -> reqs
	tokens := map[string]map[int64]bool{}  // key/lease -> tokens
	add := func(m map[string]map[string]bool, k, v string) {
		if m[k] == nil {
			m[k] = map[string]bool{}
		}
		m[k][v] = true
	}
	for _, e := range events {
		if e.Req == "" || e.Lease == "" {
			continue
		}
		if (e.Op == OpAcquire && e.Phase == Return && e.Outcome == OK) || e.Op == OpServer {
			add(leases, e.Key+"/"+e.Req, e.Lease)
			add(reqs, e.Key+"/"+e.Lease, e.Req)
			if tokens[e.Key+"/"+e.Lease] == nil {
				tokens[e.Key+"/"+e.Lease] = map[int64]bool{}
			}
			tokens[e.Key+"/"+e.Lease][e.Token] = true
		}
	}
	var vs []Violation
	for req, ls := range leases {
		if len(ls) > 1 {
			vs = append(vs, Violation{"I6", fmt.Sprintf("request %s produced %d holdings: %v", req, len(ls), ls)})
		}
	}
	for lease, rs := range reqs {
		if len(rs) > 1 {
			vs = append(vs, Violation{"I6", fmt.Sprintf("lease %s was reported for %d requests: %v", lease, len(rs), rs)})
		}
	}
	for lease, ts := range tokens {
		if len(ts) > 1 {
			vs = append(vs, Violation{"I2", fmt.Sprintf("lease %s was reported with %d tokens: %v", lease, len(ts), ts)})
		}
	}
	return vs
}

// CheckStored checks the observers' reads of the stored object. I2 along the
// stored history: a read lists the ended holdings oldest first, then the
// holder, so tokens grow along a read, and a holding first seen after another
// has the higher token. I1 against the store: a read sent and
// answered within a confirmed holding shows that holding as the holder.
func CheckStored(events []Event, hs []Holding) []Violation {
	var reads []Event
	for _, e := range events {
		if e.Op == OpServer {
			reads = append(reads, e)
		}
	}
	// One read's ended holdings (Point) come before its holder (Return).
	sort.SliceStable(reads, func(i, j int) bool {
		if reads[i].T != reads[j].T {
			return reads[i].T < reads[j].T
		}
		return reads[i].Phase == Point && reads[j].Phase != Point
	})
	var vs []Violation
	seen := map[string]bool{}
	last := map[string]Event{} // key -> the holding seen first most recently
	var prev Event
	for _, e := range reads {
		if e.Lease != "" && prev.Lease != "" && e.T == prev.T && e.Key == prev.Key && e.Token <= prev.Token {
			vs = append(vs, Violation{"I2", fmt.Sprintf("key %s: a read lists holding %s (token %d) after %s (token %d)", e.Key, e.Lease, e.Token, prev.Lease, prev.Token)})
		}
		prev = e
		if e.Lease == "" || seen[e.Key+"/"+e.Lease] {
			continue
		}
		seen[e.Key+"/"+e.Lease] = true
		if prev, ok := last[e.Key]; ok && e.Token <= prev.Token {
			vs = append(vs, Violation{"I2", fmt.Sprintf("key %s: stored holding %s has token %d, after stored holding %s with token %d", e.Key, e.Lease, e.Token, prev.Lease, prev.Token)})
		}
		last[e.Key] = e
	}
	byKey := map[string][]Holding{}
	for _, h := range hs {
		byKey[h.Key] = append(byKey[h.Key], h)
	}
	reported := map[string]bool{} // one violation per holding is enough
	for _, e := range reads {
		// A full read records its send time in Deadline.
		if e.Phase != Return || e.Deadline == 0 {
			continue
		}
		for _, h := range byKey[e.Key] {
			if h.Start <= e.Deadline && e.T <= h.End && h.Lease != e.Lease && !reported[h.Lease] {
				reported[h.Lease] = true
				vs = append(vs, Violation{"I1", fmt.Sprintf("key %s: %v held %s (token %d) from %d until %d (%s), but a read from %d to %d found holder %q",
					e.Key, h.Procs, h.Lease, h.Token, h.Start, h.End, h.Ended, e.Deadline, e.T, e.Lease)})
			}
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
