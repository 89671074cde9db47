package history

import (
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// The one sequential specification of a lock that every recorded history is
// checked against with porcupine: the fault-injection suite's (Operations
// builds its operations from the clients' events) and the integration
// suite's model-based test (which builds them itself).
//
// The state of a key is the current holding (lease and request ID), whether
// its client was told it lost the lock, and the last fencing token. The only
// transition nobody records is the controller's expiry; the model allows it
// before any operation, but only for a holding whose client had already lost
// it (I5): a lost or killed holder's Abandon spans from its last safe
// deadline to the moment it noticed, so an expiry that ended a holding
// before its holder's safe deadline makes the history non-linearizable as
// soon as anybody observes or acquires the lock in between.

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
	// Renew, Release, Crash, Abandon: the holding.
	Lease string
}

// Output is what an operation returned.
type Output struct {
	// Outcome: OK, Locked, Timeout or Lost; anything else is an unknown outcome.
	Outcome string
	// Acquire ok: the lease and token. Locked: the holder the error names,
	// or Queued when it named none because the lock was free with waiters
	// queued (neither: the holder is not known). Observe: the stored holder
	// (empty when free) and status.fencingToken.
	Lease, Req string
	Token      int64
	Queued     bool
}

type state struct {
	Held       bool
	Lease, Req string
	// Phantom: an acquire of unknown outcome whose write may have committed
	// although its caller never learned it (lease unknown, nobody renews it).
	Phantom bool
	// Abandoned: its client lost it; the controller may expire it at any time.
	Abandoned bool
	LastToken int64
	// TokenUnsure: a phantom took a token above LastToken not known to anyone
	// until the next observe.
	TokenUnsure bool
}

func (s state) holds(lease, req string) bool {
	return s.Held && (s.Lease == lease || (s.Phantom && s.Req == req))
}

func (s state) free() state { return state{LastToken: s.LastToken, TokenUnsure: s.TokenUnsure} }

func step(st, in, out any) []any {
	s, i, o := st.(state), in.(Input), out.(Output) //nolint:errcheck // porcupine hands back only the types this model gave it
	pre := []state{s}
	if s.Held && s.Abandoned {
		pre = append(pre, s.free()) // the controller expired it first
	}
	var next []any
	for _, p := range pre {
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
	mine := p.Held && p.Lease == i.Lease
	switch i.Kind {
	case KindAcquire:
		return acquire(p, i, o)
	case KindRenew:
		switch o.Outcome {
		case OK:
			return only(mine)
		case Lost:
			return only(!mine || p.Abandoned)
		}
		return nil
	case KindRelease:
		switch o.Outcome {
		case OK:
			if mine {
				return []state{p.free()}
			}
			return nil
		case Lost:
			return only(!mine || p.Abandoned)
		}
		if mine { // unknown: it may have committed
			return []state{p, p.free()}
		}
		return []state{p}
	case KindCrash:
		return []state{p}
	case KindAbandon:
		if mine {
			p.Abandoned = true
		}
		return []state{p}
	case KindObserve:
		// Reads are compared by lease only: a phantom stands for whichever
		// holding the read shows (a waiter whose Acquire gave up may still be
		// handed the lock when its dequeue write failed), and tokens are the
		// step checks' business.
		switch {
		case o.Lease == "":
			return only(!p.Held)
		case p.Held && p.Lease == o.Lease:
			return []state{p}
		case p.Held && p.Phantom:
			p.Lease, p.Phantom = o.Lease, false
			if p.TokenUnsure {
				p.LastToken, p.TokenUnsure = o.Token, false
			}
			return []state{p}
		}
		return nil
	}
	return nil
}

func acquire(p state, i Input, o Output) []state {
	if i.Retry {
		orig := p.Held && p.Lease == i.OrigLease
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
		switch {
		case p.Held && p.Lease == o.Lease:
			return []state{p} // a call with the request ID of the holding returned it
		case p.Held && p.Phantom && p.Req == i.Req, !p.Held && (p.TokenUnsure || o.Token > p.LastToken):
			return []state{{Held: true, Lease: o.Lease, Req: i.Req, LastToken: o.Token}}
		}
		return nil
	case Locked:
		switch {
		case o.Lease != "":
			if p.holds(o.Lease, o.Req) {
				return []state{p}
			}
			return nil
		case o.Queued:
			if !p.Held && i.QueueMaybe {
				return []state{p}
			}
			return nil
		}
		return []state{p}
	case Lost: // the holding of an earlier call with this request ID ended
		return []state{p}
	case Timeout:
		if i.Try {
			return nil
		}
	}
	// Unknown outcome: the write may have committed.
	res := []state{p}
	if !p.Held {
		res = append(res, state{Held: true, Req: i.Req, Phantom: true, Abandoned: true, LastToken: p.LastToken, TokenUnsure: true})
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
		if o.Lease == "" {
			return fmt.Sprintf("Observe(%s) -> free, token %d", i.Key, o.Token)
		}
		return fmt.Sprintf("Observe(%s) -> %s (%s), token %d", i.Key, short(o.Lease), o.Req, o.Token)
	}
	switch {
	case o.Outcome == OK && i.Kind == KindAcquire:
		return fmt.Sprintf("%s -> %s token %d", call, short(o.Lease), o.Token)
	case o.Outcome == Locked && o.Lease != "":
		return fmt.Sprintf("%s -> locked by %s (%s)", call, short(o.Lease), o.Req)
	case o.Outcome == Locked && o.Queued:
		return fmt.Sprintf("%s -> locked (free, queued)", call)
	}
	return fmt.Sprintf("%s -> %s", call, o.Outcome)
}

func describeState(st any) string {
	s := st.(state) //nolint:errcheck // porcupine hands back only the types this model gave it
	tok := fmt.Sprintf("token %d", s.LastToken)
	if s.TokenUnsure {
		tok = fmt.Sprintf("token > %d", s.LastToken)
	}
	if !s.Held {
		return "free, " + tok
	}
	h := short(s.Lease)
	if s.Phantom {
		h = "phantom of " + s.Req
	}
	if s.Abandoned {
		h += " (lost by its client)"
	}
	return fmt.Sprintf("held by %s, %s", h, tok)
}

// Operations turns a history into porcupine operations: acquires and releases
// from their invoke/return pairs (one without a return never returned: its
// outcome is unknown), every "lost" as an abandon of the holding spanning
// from the holder's last safe deadline (if earlier) to when it noticed, every
// kill as an abandon no earlier than the killed holder's safe deadline, and
// observer reads.
func Operations(events []Event) []porcupine.Operation {
	type pk struct {
		proc string
		id   int64
	}
	invokes := map[pk]Event{}
	returns := map[pk]Event{}
	var order []pk
	deadline := map[string]int64{}
	held := map[string][]Event{} // proc -> acquire returns
	var ops []porcupine.Operation
	clients := map[string]int{}
	cid := func(p string) int {
		if _, ok := clients[p]; !ok {
			clients[p] = len(clients)
		}
		return clients[p]
	}
	// A holder that noticed the loss (lost) gave it up by then, or earlier
	// at its safe deadline. A killed holder stopped acting at once, but its
	// lease is its own until its safe deadline: nobody may end it before.
	abandon := func(proc, key, lease string, t int64, killed bool) {
		call, ret := t, t
		if d, ok := deadline[lease]; ok {
			if killed {
				call, ret = d, max(d, t)
			} else if d < call {
				call = d
			}
		}
		ops = append(ops, porcupine.Operation{ClientId: cid(proc), Input: Input{Kind: KindAbandon, Key: key, Lease: lease}, Call: call, Output: Output{Outcome: OK}, Return: ret})
	}
	ended := map[string]bool{}
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
					held[e.Proc] = append(held[e.Proc], e)
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
			for _, a := range held[e.Proc] {
				if !ended[e.Proc+"/"+a.Lease] {
					ended[e.Proc+"/"+a.Lease] = true
					abandon(e.Proc, a.Key, a.Lease, e.T, true)
				}
			}
		case OpServer:
			if e.Phase == Return { // a read: Deadline holds its send time
				ops = append(ops, porcupine.Operation{ClientId: cid(e.Proc), Input: Input{Kind: KindObserve, Key: e.Key}, Call: e.Deadline, Output: Output{Outcome: OK, Lease: e.Lease, Req: e.Req, Token: e.Token}, Return: e.T})
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
		op := porcupine.Operation{ClientId: cid(inv.Proc), Input: Input{Kind: kd, Key: inv.Key, Req: inv.Req, Lease: inv.Lease}, Call: inv.T, Return: math.MaxInt64}
		switch {
		case !ok:
			op.Output = Output{Outcome: Failed}
		case kd == KindRelease && ret.Outcome == Lost:
			// A partitioned client cannot tell whether its release committed
			// before it learned the loss: for these clients it is unknown.
			op.Output, op.Return = Output{Outcome: Failed}, ret.T
		default:
			op.Output, op.Return = Output{Outcome: ret.Outcome, Lease: ret.Lease, Token: ret.Token}, ret.T
		}
		ops = append(ops, op)
	}
	return ops
}

// CheckLinearizable checks the lock histories with porcupine. It returns the
// result (Ok, Illegal or Unknown after timeout) and, for Illegal, the
// partitions' descriptions.
func CheckLinearizable(events []Event, timeout time.Duration) (porcupine.CheckResult, porcupine.LinearizationInfo, int) {
	ops := Operations(events)
	res, info := porcupine.CheckOperationsVerbose(Model(), ops, timeout)
	return res, info, len(ops)
}
