package history

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// The one sequential specification of a lock that every recorded history is
// checked against with porcupine: the fault-injection suite's (Operations
// builds its operations from the clients' events) and the integration
// suite's model-based tests (which build them themselves), for every type of
// lock: a Mutex has only exclusive holdings, an RWMutex one exclusive holding
// (its writer) or shared ones (its readers), a Semaphore up to its permits
// shared ones, each on a slot of its own.
//
// The state of a key is its holdings (each with its lease and request ID,
// mode and slot, and whether its client was told it lost it) and the last
// fencing token issued. An acquisition is admitted only when it fits: an
// exclusive one when nothing is held, a shared one when no exclusive holding
// exists and fewer than the acquire's Limit shared ones do, on a slot none of
// them occupies; every acquisition's token is above every token issued
// before. The only transition nobody records is the controller's expiry; the
// model allows it before any operation, for any set of holdings whose
// clients had already lost them (I5): a lost or killed holder's Abandon, and
// that of a holder whose release returned an error, spans from its last safe
// deadline to the moment it noticed (or stopped), so an expiry that
// ended a holding before its holder's safe deadline makes the history
// non-linearizable as soon as anybody observes the lock or an acquisition
// needs the room in between.

// Kind is the kind of an operation.
type Kind int

// Operation kinds.
const (
	KindAcquire Kind = iota // Acquire or TryAcquire, also a retry with an earlier request ID
	KindRenew
	KindRelease
	KindCrash   // the holder stops renewing and forgets the lock (no effect on the state)
	KindAbandon // the holder's Done fired with ErrLockLost, or its process was killed
	KindObserve // a read of the stored object
)

// Input is what an operation asked.
type Input struct {
	Kind Kind
	Key  string
	// Acquire: the request ID, whether it is a TryAcquire, whether it
	// retries the earlier successful call that created OrigLease, and
	// whether a blocking Acquire ran concurrently (so the queue may be
	// non-empty).
	Req        string
	Try        bool
	Retry      bool
	OrigLease  string
	QueueMaybe bool
	// Acquire: whether it asks for a shared holding (an RWMutex's reader, a
	// Semaphore's permit) and, if so, how many shared holdings the lock
	// admits at once (its SharedLimit) and so the range of slots.
	Shared bool
	Limit  int
	// Renew, Release, Crash, Abandon: the holding.
	Lease string
}

// Output is what an operation returned.
type Output struct {
	// Outcome: OK, Locked, Timeout or Lost; anything else is an unknown outcome.
	Outcome string
	// Acquire ok: the lease and token (and slot, when shared). Locked: the
	// exclusive holding the error names, or SharedHeld, the number of shared
	// holdings it counted, or Queued when it named none because the lock
	// admitted the acquire but waiters were queued (none of these: the
	// holders are not known). Observe: the stored exclusive holder (empty
	// when there is none) and status.fencingToken.
	Lease, Req string
	Token      int64
	Slot       int32
	SharedHeld int
	Queued     bool
	// Observe: the stored shared holdings.
	Shared []Seen
}

// Seen is one stored shared holding a read showed.
type Seen struct {
	Lease, Req string
	Slot       int32
	Token      int64
}

// held is one holding of the model's lock.
type held struct {
	Lease, Req string
	Shared     bool
	// Slot is a shared holding's permit; -1 while unknown (a phantom's).
	Slot int32
	// Phantom: an acquire of unknown outcome whose write may have committed
	// although its caller never learned it (lease unknown, nobody renews it).
	Phantom bool
	// Abandoned: its client lost it; the controller may expire it at any time.
	Abandoned bool
}

func compareHeld(a, b held) int {
	bit := func(v bool) int {
		if v {
			return 1
		}
		return 0
	}
	return cmp.Or(
		cmp.Compare(bit(a.Phantom), bit(b.Phantom)),
		cmp.Compare(bit(a.Shared), bit(b.Shared)),
		cmp.Compare(a.Slot, b.Slot),
		strings.Compare(a.Lease, b.Lease),
		strings.Compare(a.Req, b.Req),
		cmp.Compare(bit(a.Abandoned), bit(b.Abandoned)),
	)
}

type state struct {
	// Holds are the holdings, in a canonical order so that equal states
	// compare equal.
	Holds     []held
	LastToken int64
	// TokenUnsure: a phantom took a token above LastToken not known to anyone
	// until the next observe.
	TokenUnsure bool
}

func equalStates(a, b any) bool {
	s, t := a.(state), b.(state) //nolint:errcheck // porcupine hands back only the types this model gave it
	return s.LastToken == t.LastToken && s.TokenUnsure == t.TokenUnsure && slices.Equal(s.Holds, t.Holds)
}

func hashState(a any) uint64 {
	s := a.(state) //nolint:errcheck // porcupine hands back only the types this model gave it
	h := fnv.New64a()
	_, _ = h.Write([]byte(strconv.FormatInt(s.LastToken, 10)))
	for _, x := range s.Holds {
		_, _ = h.Write([]byte("|" + x.Lease + "/" + x.Req + "/" + strconv.Itoa(int(x.Slot))))
	}
	return h.Sum64()
}

// mine is the index of the known holding lease, or -1.
func (s state) mine(lease string) int {
	if lease == "" {
		return -1
	}
	return slices.IndexFunc(s.Holds, func(h held) bool { return !h.Phantom && h.Lease == lease })
}

// holds reports whether lease, or a phantom of request req, holds the lock.
func (s state) holds(lease, req string) bool {
	return s.mine(lease) >= 0 || slices.ContainsFunc(s.Holds, func(h held) bool { return h.Phantom && h.Req == req })
}

// admits reports whether an acquisition in the mode asked fits the holdings.
func (s state) admits(shared bool, limit int) bool {
	if !shared {
		return len(s.Holds) == 0
	}
	return len(s.Holds) < limit && !slices.ContainsFunc(s.Holds, func(h held) bool { return !h.Shared })
}

func (s state) slotTaken(slot int32) bool {
	return slices.ContainsFunc(s.Holds, func(h held) bool { return h.Shared && h.Slot == slot })
}

func (s state) with(h held) state {
	s.Holds = append(slices.Clone(s.Holds), h)
	slices.SortFunc(s.Holds, compareHeld)
	return s
}

func (s state) without(i int) state {
	s.Holds = slices.Delete(slices.Clone(s.Holds), i, i+1)
	return s
}

func (s state) set(i int, h held) state {
	s.Holds = slices.Clone(s.Holds)
	s.Holds[i] = h
	slices.SortFunc(s.Holds, compareHeld)
	return s
}

// expiries are s and every state the controller can make of it by expiring
// some of the holdings whose clients lost them.
func (s state) expiries() []state {
	out := []state{s}
	for i := len(s.Holds) - 1; i >= 0; i-- {
		if !s.Holds[i].Abandoned {
			continue
		}
		for _, t := range out {
			// Removing index i keeps the indexes below it valid for the
			// next round, which goes downwards.
			out = append(out, t.without(i))
		}
	}
	return out
}

func step(st, in, out any) []any {
	s, i, o := st.(state), in.(Input), out.(Output) //nolint:errcheck // porcupine hands back only the types this model gave it
	var next []any
	for _, p := range s.expiries() {
		for _, n := range apply(p, i, o) {
			next = append(next, n)
		}
	}
	return next
}

func apply(p state, i Input, o Output) []state {
	only := func(ok bool) []state {
		if ok {
			return []state{p}
		}
		return nil
	}
	m := p.mine(i.Lease)
	switch i.Kind {
	case KindAcquire:
		return acquire(p, i, o)
	case KindRenew:
		switch o.Outcome {
		case OK:
			return only(m >= 0)
		case Lost:
			return only(m < 0 || p.Holds[m].Abandoned)
		}
		return nil
	case KindRelease:
		switch o.Outcome {
		case OK:
			if m >= 0 {
				return []state{p.without(m)}
			}
			return nil
		case Lost:
			// Release ends the holding's context before it writes: from its
			// call on, nobody renews the holding, and the controller may
			// expire it before the release's write lands (a slow or
			// retried write). Either way nothing of it is held after. A
			// holding taken from its holder before the call still breaks
			// I5: that acquisition returned before this call began.
			if m >= 0 {
				return []state{p.without(m)}
			}
			return []state{p}
		}
		if m >= 0 { // unknown: it may have committed
			return []state{p, p.without(m)}
		}
		return []state{p}
	case KindCrash:
		return []state{p}
	case KindAbandon:
		if m >= 0 {
			h := p.Holds[m]
			h.Abandoned = true
			return []state{p.set(m, h)}
		}
		return []state{p}
	case KindObserve:
		return observe(p, o)
	}
	return nil
}

// observe matches a read with the holdings. Reads are compared by lease,
// mode and slot: a phantom stands for whichever holding of its mode the read
// shows that no known holding explains, preferably one of its request (a
// waiter whose Acquire gave up may still be handed the lock when its dequeue
// write failed), and tokens are the step checks' business, but for
// status.fencingToken, which settles a token a phantom may have taken.
func observe(p state, o Output) []state {
	type shown struct {
		lease, req string
		shared     bool
		slot       int32
	}
	var read []shown
	if o.Lease != "" {
		read = append(read, shown{lease: o.Lease, req: o.Req})
	}
	for _, s := range o.Shared {
		read = append(read, shown{lease: s.Lease, req: s.Req, shared: true, slot: s.Slot})
	}
	if len(read) != len(p.Holds) {
		return nil
	}
	matched := make([]bool, len(read))
	var phantoms []int
	for k, h := range p.Holds {
		if h.Phantom {
			phantoms = append(phantoms, k)
			continue
		}
		j := slices.IndexFunc(read, func(s shown) bool { return s.lease == h.Lease })
		if j < 0 || read[j].shared != h.Shared || (h.Shared && read[j].slot != h.Slot) {
			return nil
		}
		matched[j] = true
	}
	for _, k := range phantoms {
		ph := p.Holds[k]
		best := -1
		for j, s := range read {
			if matched[j] || s.shared != ph.Shared {
				continue
			}
			if best < 0 || (s.req == ph.Req && read[best].req != ph.Req) {
				best = j
			}
		}
		if best < 0 {
			return nil
		}
		matched[best] = true
		ph.Lease, ph.Slot, ph.Phantom = read[best].lease, read[best].slot, false
		if !ph.Shared {
			ph.Slot = 0
		}
		p = p.set(k, ph)
	}
	if p.TokenUnsure && len(phantoms) > 0 {
		p.LastToken, p.TokenUnsure = max(p.LastToken, o.Token), false
	}
	return []state{p}
}

func acquire(p state, i Input, o Output) []state {
	if i.Retry {
		orig := p.mine(i.OrigLease) >= 0
		switch o.Outcome {
		case OK:
			if o.Lease == i.OrigLease && orig {
				return []state{p}
			}
		case Lost:
			if !orig {
				return []state{p}
			}
		}
		return nil
	}
	switch o.Outcome {
	case OK:
		if p.mine(o.Lease) >= 0 {
			return []state{p} // a call with the request ID of the holding returned it
		}
		slot := o.Slot
		if !i.Shared {
			slot = 0
		}
		got := held{Lease: o.Lease, Req: i.Req, Shared: i.Shared, Slot: slot}
		// The phantom of this request ID committed after all, and this call
		// found it.
		if k := slices.IndexFunc(p.Holds, func(h held) bool { return h.Phantom && h.Req == i.Req && h.Shared == i.Shared }); k >= 0 {
			if i.Shared && p.slotTaken(slot) {
				return nil
			}
			n := p.set(k, got)
			n.LastToken = max(n.LastToken, o.Token)
			if !i.Shared {
				// Nothing committed after an exclusive holding that still lasts.
				n.LastToken, n.TokenUnsure = o.Token, false
			}
			return []state{n}
		}
		if !p.admits(i.Shared, i.Limit) || (!p.TokenUnsure && o.Token <= p.LastToken) {
			return nil
		}
		if i.Shared && (slot < 0 || int(slot) >= i.Limit || p.slotTaken(slot)) {
			return nil
		}
		n := p.with(got)
		n.LastToken, n.TokenUnsure = o.Token, false
		return []state{n}
	case Locked:
		switch {
		case o.Lease != "":
			if p.holds(o.Lease, o.Req) {
				return []state{p}
			}
			return nil
		case o.SharedHeld > 0:
			n := 0
			for _, h := range p.Holds {
				if h.Shared {
					n++
				}
			}
			if n == o.SharedHeld && (!p.admits(i.Shared, i.Limit) || i.QueueMaybe) {
				return []state{p}
			}
			return nil
		case o.Queued:
			if p.admits(i.Shared, i.Limit) && i.QueueMaybe {
				return []state{p}
			}
			return nil
		}
		return []state{p}
	case Lost:
		// The holding of this request ID ended: an earlier call's, or this
		// call's own, whose write committed while its answer was lost and
		// which ended before the call's next read found it recorded (I6).
		// Either way nothing is held now; meanwhile, as for an unknown
		// outcome, the holding may have been there.
	case Timeout:
		if i.Try {
			return nil
		}
	}
	// Unknown outcome: the write may have committed.
	res := []state{p}
	if p.admits(i.Shared, i.Limit) {
		n := p.with(held{Req: i.Req, Shared: i.Shared, Slot: -1, Phantom: true, Abandoned: true})
		n.TokenUnsure = true
		res = append(res, n)
	}
	return res
}

// Model is the porcupine model of a set of locks, partitioned by key.
func Model() porcupine.Model {
	m := porcupine.NondeterministicModel{
		Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
			by := map[string][]porcupine.Operation{}
			var keys []string
			for _, op := range h {
				k := op.Input.(Input).Key //nolint:errcheck // porcupine hands back only the types this model gave it
				if _, ok := by[k]; !ok {
					keys = append(keys, k)
				}
				by[k] = append(by[k], op)
			}
			sort.Strings(keys)
			out := make([][]porcupine.Operation, 0, len(keys))
			for _, k := range keys {
				out = append(out, by[k])
			}
			return out
		},
		Init:              func() []any { return []any{state{}} },
		Step:              step,
		Equal:             equalStates,
		Hash:              hashState,
		DescribeOperation: Describe,
		DescribeState:     describeState,
	}
	return m.ToModel()
}

func short(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

// Describe is one operation as a line of a report.
func Describe(in, out any) string {
	i, o := in.(Input), out.(Output) //nolint:errcheck // porcupine hands back only the types this model gave it
	var call string
	switch i.Kind {
	case KindAcquire:
		name := "Acquire"
		if i.Try {
			name = "TryAcquire"
		}
		if i.Retry {
			name = "Retry"
		}
		if i.Shared {
			name += fmt.Sprintf("Shared[%d]", i.Limit)
		}
		call = fmt.Sprintf("%s(%s %s)", name, i.Key, i.Req)
	case KindRenew:
		call = fmt.Sprintf("Renew(%s)", short(i.Lease))
	case KindRelease:
		call = fmt.Sprintf("Release(%s)", short(i.Lease))
	case KindCrash:
		return fmt.Sprintf("Crash(%s)", short(i.Lease))
	case KindAbandon:
		return fmt.Sprintf("Abandon(%s)", short(i.Lease))
	case KindObserve:
		var shown []string
		if o.Lease != "" {
			shown = append(shown, fmt.Sprintf("%s (%s)", short(o.Lease), o.Req))
		}
		for _, s := range o.Shared {
			shown = append(shown, fmt.Sprintf("%s (%s) slot %d", short(s.Lease), s.Req, s.Slot))
		}
		if len(shown) == 0 {
			return fmt.Sprintf("Observe(%s) -> free, token %d", i.Key, o.Token)
		}
		return fmt.Sprintf("Observe(%s) -> %s, token %d", i.Key, strings.Join(shown, ", "), o.Token)
	}
	switch {
	case o.Outcome == OK && i.Kind == KindAcquire && i.Shared:
		return fmt.Sprintf("%s -> %s slot %d token %d", call, short(o.Lease), o.Slot, o.Token)
	case o.Outcome == OK && i.Kind == KindAcquire:
		return fmt.Sprintf("%s -> %s token %d", call, short(o.Lease), o.Token)
	case o.Outcome == Locked && o.Lease != "":
		return fmt.Sprintf("%s -> locked by %s (%s)", call, short(o.Lease), o.Req)
	case o.Outcome == Locked && o.SharedHeld > 0:
		return fmt.Sprintf("%s -> locked by %d shared holdings", call, o.SharedHeld)
	case o.Outcome == Locked && o.Queued:
		return fmt.Sprintf("%s -> locked (admitted, queued)", call)
	}
	return fmt.Sprintf("%s -> %s", call, o.Outcome)
}

func describeState(st any) string {
	s := st.(state) //nolint:errcheck // porcupine hands back only the types this model gave it
	tok := fmt.Sprintf("token %d", s.LastToken)
	if s.TokenUnsure {
		tok = fmt.Sprintf("token > %d", s.LastToken)
	}
	if len(s.Holds) == 0 {
		return "free, " + tok
	}
	var hs []string
	for _, h := range s.Holds {
		d := short(h.Lease)
		if h.Phantom {
			d = "phantom of " + h.Req
		}
		if h.Shared {
			d += fmt.Sprintf(" shared slot %d", h.Slot)
		}
		if h.Abandoned {
			d += " (lost by its client)"
		}
		hs = append(hs, d)
	}
	return fmt.Sprintf("held by %s, %s", strings.Join(hs, "; "), tok)
}

// Operations turns a history into porcupine operations: acquires and releases
// from their invoke/return pairs (one without a return never returned: its
// outcome is unknown), every "lost" as an abandon of the holding spanning
// from the holder's last safe deadline (if earlier) to when it noticed, every
// kill and every release that returned an error as an abandon no earlier than
// the holder's safe deadline, and observer reads.
func Operations(events []Event) []porcupine.Operation {
	type pk struct {
		proc string
		id   int64
	}
	invokes := map[pk]Event{}
	returns := map[pk]Event{}
	var order []pk
	deadline := map[string]int64{}
	acquired := map[string][]Event{} // proc -> acquire returns
	var ops []porcupine.Operation
	clients := map[string]int{}
	cid := func(p string) int {
		if _, ok := clients[p]; !ok {
			clients[p] = len(clients)
		}
		return clients[p]
	}
	// A holder that noticed the loss (lost) gave it up by then, or earlier
	// at its safe deadline. A killed holder, and one whose release failed,
	// stopped renewing at once (at the kill, at the release's call), but its
	// lease is its own until its safe deadline: nobody may end it before.
	abandon := func(proc, key, lease string, t int64, stopped bool) {
		call, ret := t, t
		if d, ok := deadline[lease]; ok {
			if stopped {
				call, ret = d, max(d, t)
			} else if d < call {
				call = d
			}
		}
		ops = append(ops, porcupine.Operation{ClientId: cid(proc), Input: Input{Kind: KindAbandon, Key: key, Lease: lease}, Call: call, Output: Output{Outcome: OK}, Return: ret, Metadata: OpInfo{Proc: proc}})
	}
	ended := map[string]bool{}
	shared := sharedShown(events)
	for _, e := range sorted(events) {
		switch e.Op {
		case OpAcquire, OpRelease:
			k := pk{e.Proc, e.ID}
			if e.Phase == Invoke {
				invokes[k] = e
				order = append(order, k)
			} else {
				returns[k] = e
				if e.Op == OpAcquire && e.Outcome == OK {
					acquired[e.Proc] = append(acquired[e.Proc], e)
					if e.Deadline > deadline[e.Lease] {
						deadline[e.Lease] = e.Deadline
					}
				}
			}
			if e.Op == OpRelease && e.Phase == Invoke {
				ended[e.Proc+"/"+e.Lease] = true
			}
		case OpDeadline:
			if e.Deadline > deadline[e.Lease] {
				deadline[e.Lease] = e.Deadline
			}
		case OpLost:
			ended[e.Proc+"/"+e.Lease] = true
			abandon(e.Proc, e.Key, e.Lease, e.T, false)
		case OpKill:
			for _, a := range acquired[e.Proc] {
				if !ended[e.Proc+"/"+a.Lease] {
					ended[e.Proc+"/"+a.Lease] = true
					abandon(e.Proc, a.Key, a.Lease, e.T, true)
				}
			}
		case OpServer:
			if e.Phase == Return && !e.Shared { // a read: Deadline holds its send time
				out := Output{Outcome: OK, Lease: e.Lease, Req: e.Req, Token: e.Token, Shared: shared[readOf(e)]}
				ops = append(ops, porcupine.Operation{ClientId: cid(e.Proc), Input: Input{Kind: KindObserve, Key: e.Key}, Call: e.Deadline, Output: out, Return: e.T, Metadata: OpInfo{Proc: e.Proc}})
			}
		}
	}
	for _, k := range order {
		inv := invokes[k]
		ret, ok := returns[k]
		kd := KindAcquire
		if inv.Op == OpRelease {
			kd = KindRelease
		}
		in := Input{Kind: kd, Key: inv.Key, Req: inv.Req, Lease: inv.Lease, Shared: inv.Shared, Limit: inv.Permits}
		op := porcupine.Operation{ClientId: cid(inv.Proc), Input: in, Call: inv.T, Return: math.MaxInt64, Metadata: OpInfo{Proc: inv.Proc}}
		switch {
		case !ok:
			op.Output = Output{Outcome: Failed}
		case kd == KindRelease && ret.Outcome == Lost:
			// A partitioned client cannot tell whether its release committed
			// before it learned the loss: for these clients it is unknown.
			op.Output, op.Return = Output{Outcome: Failed}, ret.T
		default:
			op.Output, op.Return = Output{Outcome: ret.Outcome, Lease: ret.Lease, Token: ret.Token, Slot: ret.Slot}, ret.T
		}
		if ok {
			op.Metadata = OpInfo{Proc: inv.Proc, Err: ret.Err}
		}
		ops = append(ops, op)
		if kd == KindRelease && ok && ret.Outcome != OK {
			// Release ends the holding's context before it writes, so a
			// release that failed (a 403 while a restarted apiserver's RBAC
			// informers sync, its deadline passing while the apiserver is
			// down) left a holding nobody renews: the controller ends it
			// once its lease lapses, as it would a killed holder's.
			abandon(inv.Proc, inv.Key, inv.Lease, inv.T, true)
		}
	}
	return ops
}

// OpInfo is what Operations keeps of an operation for a report (porcupine's
// Metadata): its process and the error it returned.
type OpInfo struct{ Proc, Err string }

// readKey identifies one observer's read: its events share the process, key and time.
type readKey struct {
	proc, key string
	t         int64
}

func readOf(e Event) readKey { return readKey{e.Proc, e.Key, e.T} }

// sharedShown collects the shared holdings each read showed.
func sharedShown(events []Event) map[readKey][]Seen {
	out := map[readKey][]Seen{}
	for _, e := range events {
		if e.Op == OpServer && e.Phase == Return && e.Shared {
			out[readOf(e)] = append(out[readOf(e)], Seen{Lease: e.Lease, Req: e.Req, Slot: e.Slot, Token: e.Token})
		}
	}
	return out
}

// CheckLinearizable checks the lock histories with porcupine. It returns the
// result (Ok, Illegal or Unknown after timeout) and, for Illegal, the
// partitions' descriptions.
func CheckLinearizable(events []Event, timeout time.Duration) (porcupine.CheckResult, porcupine.LinearizationInfo, int) {
	ops := Operations(events)
	res, info := porcupine.CheckOperationsVerbose(Model(), ops, timeout)
	return res, info, len(ops)
}
