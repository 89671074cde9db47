package history

import (
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// The lock model: one lock per key, its state the current holding, whether
// its holder was told (or made unable to know) that it lost it, and the last
// token. The controller's expiry is recorded by nobody; the model allows it
// before any operation, but only for a holding whose client had already lost
// it (I5): a "lost" operation spans from the holder's last safe deadline to
// the moment it noticed, and a kill cannot take effect before the killed
// holder's safe deadline, so an expiry that ended a holding before its
// holder's safe deadline makes the history non-linearizable as soon as
// anybody observes or acquires the lock in between.

type kind int

const (
	kAcquire kind = iota
	kRelease
	kAbandon // lost, or the holder's process killed
	kObserve // an observer read the stored holder
)

type input struct {
	Kind kind
	Key  string
	Req  string
	// Lease: the holding a release or abandon is about.
	Lease string
}

type output struct {
	Outcome string
	Lease   string
	Token   int64
}

type state struct {
	Held    bool
	Lease   string
	Req     string
	Phantom bool // an acquire of unknown outcome may have committed; nobody renews it
	// Abandoned: its client lost it; the controller may expire it at any time.
	Abandoned   bool
	LastToken   int64
	TokenUnsure bool // a phantom took a token not known to anyone
}

func (s state) free() state { return state{LastToken: s.LastToken, TokenUnsure: s.TokenUnsure} }

func step(st, in, out any) []any {
	s, i, o := st.(state), in.(input), out.(output) //nolint:errcheck // porcupine hands back only the types this model gave it
	pre := []state{s}
	if s.Held && s.Abandoned {
		pre = append(pre, s.free())
	}
	var next []any
	for _, p := range pre {
		for _, n := range apply(p, i, o) {
			next = append(next, n)
		}
	}
	return next
}

func apply(p state, i input, o output) []state {
	switch i.Kind {
	case kAcquire:
		if o.Outcome == OK {
			switch {
			case p.Held && p.Lease == o.Lease:
				return []state{p} // a retry with the same request ID returned the holding
			case p.Held && p.Phantom && p.Req == i.Req:
				return []state{{Held: true, Lease: o.Lease, Req: i.Req, LastToken: o.Token}}
			case !p.Held && (p.TokenUnsure || o.Token > p.LastToken):
				return []state{{Held: true, Lease: o.Lease, Req: i.Req, LastToken: o.Token}}
			}
			return nil
		}
		if o.Outcome == Locked || o.Outcome == Lost {
			return []state{p}
		}
		res := []state{p}
		if !p.Held {
			res = append(res, state{Held: true, Req: i.Req, Phantom: true, Abandoned: true, LastToken: p.LastToken, TokenUnsure: true})
		}
		return res
	case kRelease:
		mine := p.Held && p.Lease == i.Lease
		if o.Outcome == OK {
			if mine {
				return []state{p.free()}
			}
			return nil
		}
		if mine {
			return []state{p, p.free()}
		}
		return []state{p}
	case kAbandon:
		if p.Held && p.Lease == i.Lease {
			p.Abandoned = true
		}
		return []state{p}
	case kObserve:
		if o.Lease == "" {
			if p.Held {
				return nil
			}
			return []state{p}
		}
		switch {
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

// Model is the porcupine model of a set of locks, partitioned by key.
func Model() porcupine.Model {
	m := porcupine.NondeterministicModel{
		Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
			by := map[string][]porcupine.Operation{}
			var keys []string
			for _, op := range h {
				k := op.Input.(input).Key //nolint:errcheck // only this package builds operations
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
		Init: func() []any { return []any{state{}} },
		Step: step,
		DescribeOperation: func(in, out any) string {
			i, o := in.(input), out.(output) //nolint:errcheck // only this package builds operations
			return fmt.Sprintf("%s %s req=%s lease=%s -> %s lease=%s token=%d", [...]string{"acquire", "release", "abandon", "observe"}[i.Kind], i.Key, short(i.Req), short(i.Lease), o.Outcome, short(o.Lease), o.Token)
		},
		DescribeState: func(st any) string { return fmt.Sprintf("%+v", st) },
	}
	return m.ToModel()
}

func short(s string) string {
	if len(s) > 8 {
		return s[:8]
	}
	return s
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
		ops = append(ops, porcupine.Operation{ClientId: cid(proc), Input: input{Kind: kAbandon, Key: key, Lease: lease}, Call: call, Output: output{Outcome: OK}, Return: ret})
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
				ops = append(ops, porcupine.Operation{ClientId: cid(e.Proc), Input: input{Kind: kObserve, Key: e.Key}, Call: e.Deadline, Output: output{Outcome: OK, Lease: e.Lease, Token: e.Token}, Return: e.T})
			}
		}
	}
	for _, k := range order {
		inv := invokes[k]
		ret, ok := returns[k]
		kd := kAcquire
		if inv.Op == OpRelease {
			kd = kRelease
		}
		op := porcupine.Operation{ClientId: cid(inv.Proc), Input: input{Kind: kd, Key: inv.Key, Req: inv.Req, Lease: inv.Lease}, Call: inv.T, Return: math.MaxInt64}
		if ok {
			op.Output, op.Return = output{Outcome: ret.Outcome, Lease: ret.Lease, Token: ret.Token}, ret.T
		} else {
			op.Output = output{Outcome: Failed}
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
