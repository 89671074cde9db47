package history

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// Stuck is where the linearizability check of one key gave up: the longest
// order it found of the key's operations, the model's states after it, and
// the operations none of which could come next.
type Stuck struct {
	Key string
	// Ops are the key's operations; Order indexes the longest partial linearization.
	Ops   []porcupine.Operation
	Order []int
	// States are the model's possible states after Order.
	States []string
	// Next are the operations that could be tried next (called before the
	// earliest return among the operations not yet ordered), earliest return first.
	Next []porcupine.Operation
}

// ExplainIllegal checks each key's operations on its own and describes every
// key whose history is not linearizable.
func ExplainIllegal(events []Event, timeout time.Duration) []Stuck {
	byKey := map[string][]porcupine.Operation{}
	for _, op := range Operations(events) {
		k := op.Input.(Input).Key //nolint:errcheck // Operations builds only Inputs
		byKey[k] = append(byKey[k], op)
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var out []Stuck
	for _, k := range keys {
		ops := byKey[k]
		res, info := porcupine.CheckOperationsVerbose(Model(), ops, timeout)
		if res != porcupine.Illegal {
			continue
		}
		out = append(out, stuck(k, ops, info))
	}
	return out
}

func stuck(key string, ops []porcupine.Operation, info porcupine.LinearizationInfo) Stuck {
	s := Stuck{Key: key, Ops: ops}
	if parts := info.PartialLinearizations(); len(parts) > 0 {
		for _, order := range parts[0] {
			if len(order) > len(s.Order) {
				s.Order = order
			}
		}
	}
	// Replay the order through the model: the states it can be in after it.
	states := []state{{}}
	for _, i := range s.Order {
		var next []state
		for _, st := range states {
			for _, n := range step(st, ops[i].Input, ops[i].Output) {
				ns := n.(state) //nolint:errcheck // step returns states
				if !slices.ContainsFunc(next, func(x state) bool { return equalStates(x, ns) }) {
					next = append(next, ns)
				}
			}
		}
		states = next
	}
	for _, st := range states {
		s.States = append(s.States, describeState(st))
	}
	done := make([]bool, len(ops))
	for _, i := range s.Order {
		done[i] = true
	}
	minRet := int64(math.MaxInt64)
	for i, op := range ops {
		if !done[i] {
			minRet = min(minRet, op.Return)
		}
	}
	for i, op := range ops {
		if !done[i] && op.Call <= minRet {
			s.Next = append(s.Next, op)
		}
	}
	sort.SliceStable(s.Next, func(i, j int) bool { return s.Next[i].Return < s.Next[j].Return })
	return s
}

// describeOp is one operation with its process, times (seconds of the
// monotonic clock) and the start of the error it returned.
func describeOp(op porcupine.Operation) string {
	ret := "never returned"
	if op.Return != math.MaxInt64 {
		ret = fmt.Sprintf("%.3f", float64(op.Return)/1e9)
	}
	info, _ := op.Metadata.(OpInfo) // Operations sets it; a bare operation has none
	s := fmt.Sprintf("%s [%.3f, %s] %s", info.Proc, float64(op.Call)/1e9, ret, Describe(op.Input, op.Output))
	if e := info.Err; e != "" {
		if len(e) > 100 {
			e = e[:100] + "…"
		}
		s += " (" + e + ")"
	}
	return s
}

// Summary is one line, most telling first: the key, the model's states after
// the longest order, the first operation that could not follow, and the last
// two operations of clients ordered (reads say little).
func (s Stuck) Summary() string {
	var last []string
	for k := len(s.Order) - 1; k >= 0 && len(last) < 2; k-- {
		if op := s.Ops[s.Order[k]]; op.Input.(Input).Kind != KindObserve { //nolint:errcheck // Operations builds only Inputs
			last = append([]string{describeOp(op)}, last...)
		}
	}
	next := "none"
	if len(s.Next) > 0 {
		next = describeOp(s.Next[0])
	}
	return fmt.Sprintf("key %s: the lock is %s after %d of %d operations, and cannot be followed by %s; the last of clients: %s",
		s.Key, strings.Join(s.States, " or "), len(s.Order), len(s.Ops), next, strings.Join(last, "; "))
}

// Report is the summary, then the last tail operations ordered and all the
// candidates for the next one, one per line.
func (s Stuck) Report(tail int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n  the last %d operations ordered:\n", s.Summary(), min(tail, len(s.Order)))
	for _, i := range s.Order[max(0, len(s.Order)-tail):] {
		fmt.Fprintf(&b, "    %s\n", describeOp(s.Ops[i]))
	}
	fmt.Fprintf(&b, "  then the lock is %s\n  and none of these can come next:\n", strings.Join(s.States, " or "))
	for _, op := range s.Next {
		fmt.Fprintf(&b, "    %s\n", describeOp(op))
	}
	return b.String()
}
