package main

import (
	"fmt"
	"math"
	"slices"
)

// rateSearch chooses the seed mix's offered rates: up the coarse steps until
// one is not sustained, then bisection between the highest sustained and the
// lowest unsustained rate, so that "highest sustained" is a measurement and
// not a step of the ladder. It stops when the bracket is narrow enough
// (within ±relTol of its middle, or at most absTol writes/s wide), when the
// coarse steps are all sustained, or after maxSteps steps.
type rateSearch struct {
	coarse   []float64
	absTol   float64 // writes/s
	relTol   float64 // of the bracket's middle, each side
	maxSteps int

	steps int
	next  int     // next coarse step
	lo    float64 // highest sustained so far (0: none)
	hi    float64 // lowest not sustained (0: none yet)
}

// newRateSearch: the coarse steps go up, and every rate offered lies strictly
// between the bracket's ends, so lo < hi holds however noisy the outcomes
// (a rate that fails is never below one that passed).
func newRateSearch(coarse []float64, absTol, relTol float64, maxSteps int) *rateSearch {
	return &rateSearch{coarse: slices.Sorted(slices.Values(coarse)), absTol: absTol, relTol: relTol, maxSteps: maxSteps}
}

// nextRate is the rate to offer next; false when the search is over.
func (s *rateSearch) nextRate() (float64, bool) {
	if s.steps >= s.maxSteps {
		return 0, false
	}
	if s.hi == 0 {
		if s.next >= len(s.coarse) {
			return 0, false
		}
		return s.coarse[s.next], true
	}
	if s.narrow() {
		return 0, false
	}
	mid := math.Round((s.lo + s.hi) / 2)
	if mid <= s.lo || mid >= s.hi {
		return 0, false
	}
	return mid, true
}

// narrow: the bracket [lo, hi] pins the highest sustained rate closely enough.
func (s *rateSearch) narrow() bool {
	w := s.hi - s.lo
	return w <= s.absTol || w <= s.relTol*(s.hi+s.lo)
}

// record notes the outcome of offering rate.
func (s *rateSearch) record(rate float64, sustained bool) {
	s.steps++
	if s.hi == 0 {
		s.next++
	}
	switch {
	case sustained && rate > s.lo:
		s.lo = rate
	case !sustained && (s.hi == 0 || rate < s.hi):
		s.hi = rate
	}
}

// bracket is the result: the highest sustained and the lowest not sustained
// rate offered (0 when there was none).
type bracket struct {
	Sustained, NotSustained float64
	// Narrow: the search reached its tolerance (not cut off by the step
	// limit or the end of the coarse steps).
	Narrow bool
}

func (s *rateSearch) result() bracket {
	return bracket{Sustained: s.lo, NotSustained: s.hi, Narrow: s.hi != 0 && s.narrow()}
}

func (b bracket) String() string {
	switch {
	case b.Sustained == 0 && b.NotSustained == 0:
		return "no step run"
	case b.Sustained == 0:
		return fmt.Sprintf("none sustained; not sustained at %.0f", b.NotSustained)
	case b.NotSustained == 0:
		return fmt.Sprintf("sustained %.0f; every step offered was sustained", b.Sustained)
	}
	s := fmt.Sprintf("sustained %.0f, not sustained %.0f", b.Sustained, b.NotSustained)
	if !b.Narrow {
		s += " (the step limit ended the search before the bracket was narrow)"
	}
	return s
}
