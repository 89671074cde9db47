package integration

import (
	"fmt"

	"github.com/anishathalye/porcupine"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// This file is the sequential specification of one lock that the model-based
// test (model_test.go) checks recorded histories against with porcupine.
//
// The state is the current holding (lease and request ID), whether its
// client was told it lost the lock, and the last fencing token. The only
// transition nobody records is the controller's expiry; the model allows it
// before any operation, but only for a holding whose client was already told
// it lost the lock (I5: a client's Done fires before the controller may
// expire). A crash stops renewals; the crashed client's Done then fires at its
// safe deadline, and only after that may the holding disappear.

type modelOpKind int

const (
	mAcquire modelOpKind = iota // Acquire or TryAcquire, also a retry with an earlier request ID
	mRenew
	mRelease
	mCrash   // the holder stops renewing and forgets the lock (no effect on the state)
	mLost    // the holder's Done fired with an error wrapping ErrLockLost
	mObserve // an admin reads the stored object
)

type modelResult int

const (
	rOK modelResult = iota
	rLocked
	rTimeout
	rLost
)

func (r modelResult) String() string {
	return [...]string{"ok", "ErrLocked", "ErrTimeout", "ErrLockLost"}[r]
}

type modelInput struct {
	Kind   modelOpKind
	Client int
	// Acquire: the request ID, whether it is a TryAcquire, whether it retries
	// the earlier successful call that created OrigLease, and whether a
	// blocking Acquire ran concurrently (so the queue may be non-empty).
	Req        string
	Try        bool
	Retry      bool
	OrigLease  string
	QueueMaybe bool
	// Renew, Release, Crash, Lost: the holding.
	Lease string
}

type modelOutput struct {
	Res modelResult
	// Acquire ok: the lease and token. ErrLocked: the holder the error names
	// (empty when the lock is free but waiters are queued). Observe: the
	// stored holder (empty when free) and status.fencingToken.
	Lease, Req string
	Token      int64
}

type lockState struct {
	Held       bool
	Lease, Req string
	// Phantom: a timed-out Acquire whose write may have committed although
	// its caller never learned it (lease unknown, nobody renews it).
	Phantom bool
	// Abandoned: the holder's client knows it lost the lock; the controller
	// may now expire it at any moment.
	Abandoned bool
	LastToken int64
	// TokenUnsure: a phantom holding took a token above LastToken that is
	// not known until the next Observe.
	TokenUnsure bool
}

func (s lockState) holds(lease, req string) bool {
	return s.Held && (s.Lease == lease || (s.Phantom && s.Req == req))
}

func (s lockState) free() lockState {
	return lockState{LastToken: s.LastToken, TokenUnsure: s.TokenUnsure}
}

func modelStep(st any, inp any, outp any) []any {
	s, in, out := st.(lockState), inp.(modelInput), outp.(modelOutput) //nolint:errcheck // porcupine hands back only the types this model gave it
	pre := []lockState{s}
	if s.Held && s.Abandoned {
		pre = append(pre, s.free()) // the controller expired it first
	}
	var next []any
	for _, p := range pre {
		for _, n := range modelApply(p, in, out) {
			next = append(next, n)
		}
	}
	return next
}

func modelApply(p lockState, in modelInput, out modelOutput) []lockState {
	ok := func(b bool) []lockState {
		if b {
			return []lockState{p}
		}
		return nil
	}
	switch in.Kind {
	case mAcquire:
		if in.Retry {
			switch out.Res {
			case rOK:
				return ok(out.Lease == in.OrigLease && p.Held && p.Lease == in.OrigLease)
			case rLost:
				return ok(!(p.Held && p.Lease == in.OrigLease))
			}
			return nil
		}
		switch out.Res {
		case rOK:
			if p.Held || out.Token <= p.LastToken {
				return nil
			}
			return []lockState{{Held: true, Lease: out.Lease, Req: in.Req, LastToken: out.Token}}
		case rLocked:
			if out.Lease != "" {
				return ok(p.holds(out.Lease, out.Req))
			}
			return ok(!p.Held && in.QueueMaybe)
		case rTimeout:
			if in.Try {
				return nil
			}
			res := []lockState{p}
			if !p.Held {
				res = append(res, lockState{Held: true, Req: in.Req, Phantom: true, Abandoned: true, LastToken: p.LastToken, TokenUnsure: true})
			}
			return res
		}
		return nil
	case mRenew:
		switch out.Res {
		case rOK:
			return ok(p.Held && p.Lease == in.Lease)
		case rLost:
			return ok(!(p.Held && p.Lease == in.Lease) || p.Abandoned)
		}
		return nil
	case mRelease:
		switch out.Res {
		case rOK:
			if p.Held && p.Lease == in.Lease {
				return []lockState{p.free()}
			}
			return nil
		case rLost:
			return ok(!(p.Held && p.Lease == in.Lease) || p.Abandoned)
		}
		return nil
	case mCrash:
		return ok(true)
	case mLost:
		if p.Held && p.Lease == in.Lease {
			p.Abandoned = true
		}
		return []lockState{p}
	case mObserve:
		if out.Lease == "" {
			if p.Held {
				return nil
			}
		} else if !p.holds(out.Lease, out.Req) {
			return nil
		}
		if p.TokenUnsure {
			if out.Token <= p.LastToken {
				return nil
			}
			p.LastToken, p.TokenUnsure = out.Token, false
			if p.Phantom {
				p.Lease = out.Lease
			}
			return []lockState{p}
		}
		return ok(out.Token == p.LastToken)
	}
	return nil
}

func short(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

func describeModelOp(inp any, outp any) string {
	in, out := inp.(modelInput), outp.(modelOutput) //nolint:errcheck // porcupine hands back only the types this model gave it
	var call string
	switch in.Kind {
	case mAcquire:
		name := "Acquire"
		if in.Try {
			name = "TryAcquire"
		}
		if in.Retry {
			name = "Retry"
		}
		call = fmt.Sprintf("%s(%s)", name, in.Req)
	case mRenew:
		call = fmt.Sprintf("Renew(%s)", short(in.Lease))
	case mRelease:
		call = fmt.Sprintf("Release(%s)", short(in.Lease))
	case mCrash:
		return fmt.Sprintf("Crash(%s)", short(in.Lease))
	case mLost:
		return fmt.Sprintf("Done: lost(%s)", short(in.Lease))
	case mObserve:
		if out.Lease == "" {
			return fmt.Sprintf("Observe -> free, token %d", out.Token)
		}
		return fmt.Sprintf("Observe -> %s (%s), token %d", short(out.Lease), out.Req, out.Token)
	}
	switch {
	case out.Res == rOK && in.Kind == mAcquire:
		return fmt.Sprintf("%s -> %s token %d", call, short(out.Lease), out.Token)
	case out.Res == rLocked && out.Lease != "":
		return fmt.Sprintf("%s -> ErrLocked by %s (%s)", call, short(out.Lease), out.Req)
	case out.Res == rLocked:
		return fmt.Sprintf("%s -> ErrLocked (free, queued)", call)
	}
	return fmt.Sprintf("%s -> %s", call, out.Res)
}

func describeLockState(st any) string {
	s := st.(lockState) //nolint:errcheck // porcupine hands back only the types this model gave it
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

// lockModel is the sequential specification as a porcupine model.
func lockModel() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Init:              func() []any { return []any{lockState{}} },
		Step:              modelStep,
		DescribeOperation: describeModelOp,
		DescribeState:     describeLockState,
	}
	return nm.ToModel()
}

// The specification itself must reject the histories the test is there to catch.
var _ = Describe("model-based test specification", func() {
	op := func(client int, in modelInput, out modelOutput, call, ret int64) porcupine.Operation {
		in.Client = client
		return porcupine.Operation{ClientId: client, Input: in, Output: out, Call: call, Return: ret}
	}
	acq := func(c int, req, lease string, token, call, ret int64) porcupine.Operation {
		return op(c, modelInput{Kind: mAcquire, Req: req, Try: true}, modelOutput{Res: rOK, Lease: lease, Token: token}, call, ret)
	}
	rel := func(c int, lease string, call, ret int64) porcupine.Operation {
		return op(c, modelInput{Kind: mRelease, Lease: lease}, modelOutput{Res: rOK}, call, ret)
	}
	check := func(ops ...porcupine.Operation) bool { return porcupine.CheckOperations(lockModel(), ops) }

	It("accepts a hand-over, a retry, and an expiry after the holder's Done", func() {
		Expect(check(
			acq(0, "a", "L1", 10, 0, 10),
			op(1, modelInput{Kind: mAcquire, Req: "b", Try: true}, modelOutput{Res: rLocked, Lease: "L1", Req: "a"}, 11, 12),
			op(0, modelInput{Kind: mAcquire, Req: "a", Retry: true, OrigLease: "L1"}, modelOutput{Res: rOK, Lease: "L1", Token: 10}, 13, 14),
			op(0, modelInput{Kind: mCrash, Lease: "L1"}, modelOutput{}, 15, 16),
			op(0, modelInput{Kind: mLost, Lease: "L1"}, modelOutput{}, 17, 18),
			acq(1, "c", "L2", 12, 19, 20),
			op(0, modelInput{Kind: mAcquire, Req: "a", Retry: true, OrigLease: "L1"}, modelOutput{Res: rLost}, 21, 22),
			rel(1, "L2", 23, 24),
			op(2, modelInput{Kind: mObserve}, modelOutput{Token: 12}, 25, 26),
		)).To(BeTrue())
	})
	It("rejects two holders, a token that does not grow, and an expiry before the holder's Done (I1, I2, I5)", func() {
		Expect(check(acq(0, "a", "L1", 10, 0, 10), acq(1, "b", "L2", 11, 11, 12))).To(BeFalse())
		Expect(check(acq(0, "a", "L1", 10, 0, 10), rel(0, "L1", 11, 12), acq(1, "b", "L2", 10, 13, 14))).To(BeFalse())
		Expect(check(
			acq(0, "a", "L1", 10, 0, 10),
			op(0, modelInput{Kind: mCrash, Lease: "L1"}, modelOutput{}, 11, 12),
			acq(1, "b", "L2", 12, 13, 14),
			op(0, modelInput{Kind: mLost, Lease: "L1"}, modelOutput{}, 15, 16),
		)).To(BeFalse())
	})
	It("rejects a retry that returns another lease or says a live holding ended (I6)", func() {
		Expect(check(acq(0, "a", "L1", 10, 0, 10),
			op(0, modelInput{Kind: mAcquire, Req: "a", Retry: true, OrigLease: "L1"}, modelOutput{Res: rOK, Lease: "L9", Token: 11}, 11, 12))).To(BeFalse())
		Expect(check(acq(0, "a", "L1", 10, 0, 10),
			op(0, modelInput{Kind: mAcquire, Req: "a", Retry: true, OrigLease: "L1"}, modelOutput{Res: rLost}, 11, 12))).To(BeFalse())
		Expect(check(acq(0, "a", "L1", 10, 0, 10), rel(0, "L1", 11, 12),
			op(0, modelInput{Kind: mAcquire, Req: "a", Retry: true, OrigLease: "L1"}, modelOutput{Res: rOK, Lease: "L1", Token: 10}, 13, 14))).To(BeFalse())
	})
})
