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
	// Shared marks a shared holding, on slot Slot.
	Shared bool
	Slot   int32
}

func (h *Holding) mode() string {
	if h.Shared {
		return fmt.Sprintf("shared, slot %d", h.Slot)
	}
	return "exclusive"
}

// front keeps, of the holdings added so far, the one confirmed longest and
// the one with the highest token: a new holding must start after the first
// and carry a higher token than the second, of every front it conflicts with.
type front struct{ end, top *Holding }

func (f *front) add(h *Holding) {
	if f.end == nil || h.End > f.end.End {
		f.end = h
	}
	if f.top == nil || h.Token > f.top.Token {
		f.top = h
	}
}

// fronts are the fronts of one key: of all its holdings, of the exclusive
// ones, and of the shared ones per slot. Two holdings of a key exclude each
// other unless both are shared on different slots (an RWMutex's readers, a
// Semaphore's permits): an exclusive holding conflicts with all, a shared one
// with the exclusive ones and its slot's.
type fronts struct {
	all, exclusive front
	slots          map[int32]*front
}

// against are the fronts of the holdings h conflicts with.
func (fs *fronts) against(h *Holding) []*front {
	if !h.Shared {
		return []*front{&fs.all}
	}
	out := []*front{&fs.exclusive}
	if f := fs.slots[h.Slot]; f != nil {
		out = append(out, f)
	}
	return out
}

func (fs *fronts) add(h *Holding) {
	fs.all.add(h)
	if !h.Shared {
		fs.exclusive.add(h)
		return
	}
	if fs.slots == nil {
		fs.slots = map[int32]*front{}
	}
	if fs.slots[h.Slot] == nil {
		fs.slots[h.Slot] = &front{}
	}
	fs.slots[h.Slot].add(h)
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
				h = &Holding{Key: e.Key, Lease: e.Lease, Req: e.Req, Token: e.Token, Start: e.T, Shared: e.Shared, Slot: e.Slot}
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
// key never overlap, unless both are shared on different slots: a writer is
// never together with anyone, a slot never has two holders) and I2 (tokens
// strictly increase in hold order, among holdings that exclude each other).
func CheckHoldings(hs []Holding) []Violation {
	var vs []Violation
	byKey := map[string][]*Holding{}
	for i := range hs {
		h := &hs[i]
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
		sort.SliceStable(list, func(i, j int) bool { return list[i].Start < list[j].Start })
		var fs fronts
		for _, cur := range list {
			for _, f := range fs.against(cur) {
				if prev := f.end; prev != nil && cur.Start < prev.End {
					vs = append(vs, Violation{"I1", fmt.Sprintf("key %s: holding %s (%s, token %d, %v) confirmed at %d while %s (%s, token %d, %v) was confirmed until %d (%s), overlap %.3fs",
						key, cur.Lease, cur.mode(), cur.Token, cur.Procs, cur.Start, prev.Lease, prev.mode(), prev.Token, prev.Procs, prev.End, prev.Ended, float64(prev.End-cur.Start)/1e9)})
				}
				if prev := f.top; prev != nil && cur.Token <= prev.Token {
					vs = append(vs, Violation{"I2", fmt.Sprintf("key %s: holding %s (%s) got token %d after holding %s (%s) had token %d", key, cur.Lease, cur.mode(), cur.Token, prev.Lease, prev.mode(), prev.Token)})
				}
			}
			fs.add(cur)
		}
	}
	return vs
}

// CheckPermits checks I1 for shared holdings: no key ever has more confirmed
// holdings at once than permits gives it (a Semaphore's spec.permits), and
// every shared holding's slot is in [0, permits). Keys permits does not name
// are not checked.
func CheckPermits(hs []Holding, permits map[string]int) []Violation {
	type edge struct {
		t     int64
		delta int
		h     *Holding
	}
	byKey := map[string][]edge{}
	var vs []Violation
	for i := range hs {
		h := &hs[i]
		n, ok := permits[h.Key]
		if !ok {
			continue
		}
		if h.Shared && (h.Slot < 0 || int(h.Slot) >= n) {
			vs = append(vs, Violation{"I1", fmt.Sprintf("key %s: holding %s (token %d) has slot %d, outside [0, %d)", h.Key, h.Lease, h.Token, h.Slot, n)})
		}
		if h.End <= h.Start {
			continue
		}
		byKey[h.Key] = append(byKey[h.Key], edge{h.Start, 1, h}, edge{h.End, -1, h})
	}
	for key, es := range byKey {
		// An interval ends before another starts at the same instant: a
		// hand-over is not an overlap.
		sort.Slice(es, func(i, j int) bool {
			if es[i].t != es[j].t {
				return es[i].t < es[j].t
			}
			return es[i].delta < es[j].delta
		})
		open := map[*Holding]bool{}
		worst := 0
		var at int64
		var who []string
		for _, e := range es {
			if e.delta < 0 {
				delete(open, e.h)
				continue
			}
			open[e.h] = true
			if len(open) > worst {
				worst, at, who = len(open), e.t, nil
				for h := range open {
					who = append(who, fmt.Sprintf("%s (%s, token %d)", h.Lease, h.mode(), h.Token))
				}
			}
		}
		if worst > permits[key] {
			sort.Strings(who)
			vs = append(vs, Violation{"I1", fmt.Sprintf("key %s: %d holdings confirmed at once at %d, more than its %d permits: %v", key, worst, at, permits[key], who)})
		}
	}
	return vs
}

// CheckRequestIDs checks I6: every request ID is tied to at most one lease,
// and every lease to one request ID, one token and one slot (so the token and
// slot a client was given are the ones stored, and a fence per slot guards
// the right one), counting what clients were told and what observers saw
// stored.
func CheckRequestIDs(events []Event) []Violation {
	leases := map[string]map[string]bool{} // key/req -> leases
	reqs := map[string]map[string]bool{}   // key/lease -> reqs
	tokens := map[string]map[int64]bool{}  // key/lease -> tokens
	slots := map[string]map[string]bool{}  // key/lease -> modes and slots
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
			slot := "exclusive"
			if e.Shared {
				slot = fmt.Sprintf("slot %d", e.Slot)
			}
			add(slots, e.Key+"/"+e.Lease, slot)
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
	for lease, ss := range slots {
		if len(ss) > 1 {
			vs = append(vs, Violation{"I2", fmt.Sprintf("lease %s was reported as %d different holdings: %v", lease, len(ss), ss)})
		}
	}
	return vs
}

// storedRead is one observer's read of a key: the ended holdings it listed
// (oldest first), then its shared holdings and its exclusive holder, and the
// read's send and answer times.
type storedRead struct {
	key       string
	sent, t   int64
	entries   []*Holding // ended, then shared, then the holder
	holding   map[string]bool
	found     []string // what the read showed held, for a report
	hasSender bool
}

// storedReads groups the observers' events into reads, in time order.
func storedReads(events []Event) []*storedRead {
	rank := func(e Event) int {
		switch {
		case e.Phase == Point:
			return 0
		case e.Shared:
			return 1
		}
		return 2
	}
	var evs []Event
	for _, e := range events {
		if e.Op == OpServer {
			evs = append(evs, e)
		}
	}
	sort.SliceStable(evs, func(i, j int) bool {
		if evs[i].T != evs[j].T {
			return evs[i].T < evs[j].T
		}
		return rank(evs[i]) < rank(evs[j])
	})
	var out []*storedRead
	byRead := map[readKey]*storedRead{}
	for _, e := range evs {
		r := byRead[readOf(e)]
		if r == nil {
			r = &storedRead{key: e.Key, t: e.T, holding: map[string]bool{}}
			byRead[readOf(e)] = r
			out = append(out, r)
		}
		if e.Phase == Return && !e.Shared {
			r.sent, r.hasSender = e.Deadline, e.Deadline != 0
		}
		if e.Lease == "" {
			continue
		}
		r.entries = append(r.entries, &Holding{Key: e.Key, Lease: e.Lease, Req: e.Req, Token: e.Token, Shared: e.Shared, Slot: e.Slot})
		if e.Phase == Return {
			r.holding[e.Lease] = true
			r.found = append(r.found, e.Lease)
		}
	}
	return out
}

// CheckStored checks the observers' reads of the stored object. I2 along the
// stored history: a read lists the ended holdings in the order they ended,
// then the shared holdings and the holder, so tokens grow along a read among
// holdings that exclude each other, and a holding first seen in a read sent
// after another read was answered has a higher token than every holding it
// excludes that the earlier read showed. Only real-time order counts: a read
// takes effect somewhere between its send and its answer, so of two reads
// that overlap (two observers', or one through a stalled apiserver) the one
// answered later may show the older state. I1 against the store: a read sent
// and answered within a confirmed holding shows that holding held.
func CheckStored(events []Event, hs []Holding) []Violation {
	reads := storedReads(events)
	var vs []Violation
	first := map[string][]firstSeen{} // key -> its holdings in the order first seen
	firstAt := map[string]int64{}     // key/lease -> when the read that first showed it was answered
	for _, r := range reads {
		before := r.t // without its send time, a read follows only those answered before it
		if r.hasSender {
			before = r.sent
		}
		var earlier *fronts // the holdings first seen in reads answered before r was sent
		var along fronts
		for _, e := range r.entries {
			for _, f := range along.against(e) {
				if prev := f.top; prev != nil && e.Token <= prev.Token {
					vs = append(vs, Violation{"I2", fmt.Sprintf("key %s: a read lists holding %s (%s, token %d) after %s (%s, token %d)", e.Key, e.Lease, e.mode(), e.Token, prev.Lease, prev.mode(), prev.Token)})
				}
			}
			along.add(e)
			if _, seen := firstAt[e.Key+"/"+e.Lease]; seen {
				continue
			}
			if earlier == nil {
				earlier = frontsBefore(first[e.Key], before)
			}
			for _, f := range earlier.against(e) {
				if prev := f.top; prev != nil && e.Token <= prev.Token {
					vs = append(vs, Violation{"I2", fmt.Sprintf("key %s: stored holding %s (%s) has token %d, first seen in a read sent at %d and answered at %d, after one answered at %d showed %s (%s) with token %d", e.Key, e.Lease, e.mode(), e.Token, r.sent, r.t, firstAt[e.Key+"/"+prev.Lease], prev.Lease, prev.mode(), prev.Token)})
				}
			}
			first[e.Key] = append(first[e.Key], firstSeen{r.t, e})
			firstAt[e.Key+"/"+e.Lease] = r.t
		}
	}
	byKey := map[string][]Holding{}
	for _, h := range hs {
		byKey[h.Key] = append(byKey[h.Key], h)
	}
	reported := map[string]bool{} // one violation per holding is enough
	for _, r := range reads {
		// A full read records its send time.
		if !r.hasSender {
			continue
		}
		for _, h := range byKey[r.key] {
			if h.Start <= r.sent && r.t <= h.End && !r.holding[h.Lease] && !reported[h.Lease] {
				reported[h.Lease] = true
				vs = append(vs, Violation{"I1", fmt.Sprintf("key %s: %v held %s (%s, token %d) from %d until %d (%s), but a read from %d to %d found it not held (held: %q)",
					r.key, h.Procs, h.Lease, h.mode(), h.Token, h.Start, h.End, h.Ended, r.sent, r.t, r.found)})
			}
		}
	}
	return vs
}

// firstSeen is a stored holding and when the read that first showed it was
// answered.
type firstSeen struct {
	t int64
	h *Holding
}

// frontsBefore are the fronts of the holdings first seen in reads answered
// before t (hs is in answer order).
func frontsBefore(hs []firstSeen, t int64) *fronts {
	fs := &fronts{}
	for _, s := range hs {
		if s.t >= t {
			break
		}
		fs.add(s.h)
	}
	return fs
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
