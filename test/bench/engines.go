package main

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
)

// kubelockEngine is kubelock with one admission engine, a system of the run.
type kubelockEngine struct {
	key, name string
	e         engine
}

var kubelockEngines = []kubelockEngine{{"webhook", sysWebhook, engineWebhook}, {"policy", sysPolicy, enginePolicy}, {"none", sysNone, engineNone}}

// clientSet is one of an engine's kubelock client sets, one per encoding:
// with two, workload 2 alternates between them and the others run one after
// the other.
type clientSet struct {
	locker   *kubelockLocker
	name     string // the system's name in the report
	encoding string
	factory  lockClientFactory
	answers  *mediaTypes // how the apiserver answered it
	trips    *trips      // its requests per operation
}

// runKubelock runs kubelock's workloads with each selected engine in turn,
// then turns the default engine back on, as a cluster would run.
func (b *benchRun) runKubelock(ctx context.Context) error {
	for _, en := range kubelockEngines {
		if !b.systems[en.key] || ctx.Err() != nil {
			continue
		}
		if err := b.runEngine(ctx, en); err != nil {
			return err
		}
	}
	return b.c.activate(ctx, engineWebhook)
}

// runEngine runs the selected workloads with engine en in force.
func (b *benchRun) runEngine(ctx context.Context, en kubelockEngine) error {
	logf("admission engine: %s", en.e)
	if err := b.c.activate(ctx, en.e); err != nil {
		return err
	}
	sets, err := b.clientSets(en)
	if err != nil {
		return err
	}
	if b.wl["1"] {
		b.seedMixes(ctx, en, sets)
		if len(sets) > 1 && ctx.Err() == nil {
			b.pairedStep(ctx, en, sets)
		}
	}
	if b.wl["2"] {
		b.uncontended(ctx, sets)
	}
	if b.wl["5"] {
		if err := b.holdKubelock(ctx, sets); err != nil {
			return err
		}
	}
	b.recordWire(sets)
	if b.wl["3"] {
		if err := b.handoffKubelock(ctx, en); err != nil {
			return err
		}
	}
	if b.wl["4"] {
		b.addExpiry(runExpiry(ctx, en.name, b.o.expiryTrials, b.o.expiryLease, kubelockExpiryTrial(b.c, "expiry-"+string(en.e), b.o.expiryLease)))
	}
	return nil
}

// clientSets are en's client sets, one per encoding of the run.
func (b *benchRun) clientSets(en kubelockEngine) ([]clientSet, error) {
	var sets []clientSet
	for _, enc := range b.encodings {
		name := en.name
		if enc == encCBOR {
			name = cborName(en.name)
		}
		s := clientSet{name: name, encoding: enc, answers: &mediaTypes{}, trips: newTrips()}
		s.factory = lockClients(enc, s.answers)
		var err error
		if s.locker, err = newKubelockLocker(s.factory, s.trips.wrap(b.c.user), lockNS, b.o.clients, b.o.lease); err != nil {
			return nil, err
		}
		sets = append(sets, s)
	}
	return sets, nil
}

// lockers are the sets' lockers and names, in order.
func lockers(sets []clientSet) ([]locker, []string) {
	var ls []locker
	var names []string
	for _, s := range sets {
		ls, names = append(ls, s.locker), append(names, s.name)
	}
	return ls, names
}

// seedMixes runs workload 1 with each set, profiling the webhook engine's
// first when asked to.
func (b *benchRun) seedMixes(ctx context.Context, en kubelockEngine, sets []clientSet) {
	for i, s := range sets {
		m := b.mix
		if en.e == engineWebhook && i == 0 && b.o.profile {
			m.profileStep = min(b.o.profileStep, b.o.maxSteps-1)
		}
		res := runSeedMix(ctx, b.c, s.locker, s.name, b.lockPool, m, b.pw, logf)
		b.rep.mixes = append(b.rep.mixes, res)
		for _, st := range res.Steps {
			b.rep.profiles = append(b.rep.profiles, st.Profiles...)
		}
	}
}

// pairedStep runs the encodings' seed mixes in alternating windows at one
// rate: --paired-rate, else the one they all sustained.
func (b *benchRun) pairedStep(ctx context.Context, en kubelockEngine, sets []clientSet) {
	rate := b.o.pairedRate * b.o.rateScale
	if rate <= 0 {
		rate = pairedRate(b.rep.mixes[len(b.rep.mixes)-len(sets):])
	}
	if rate <= 0 {
		logf("  paired step of %s: no rate (no seed-mix step ran)", en.name)
		return
	}
	ls, names := lockers(sets)
	steps, err := runPairedStep(ctx, b.c, ls, names, b.lockPool, b.mix, b.pw, rate, b.o.pairedRounds, b.o.profile)
	if err != nil {
		logf("  paired step of %s at %.0f writes/s: %v", en.name, rate, err)
		return
	}
	b.rep.paired = append(b.rep.paired, pairedResult{Names: names, Steps: steps, Rounds: b.o.pairedRounds})
	for _, s := range steps {
		b.rep.profiles = append(b.rep.profiles, s.Profiles...)
	}
}

// uncontended runs workload 2: with one set on locks taken for the first
// time and again, with two alternating between them.
func (b *benchRun) uncontended(ctx context.Context, sets []clientSet) {
	if len(sets) == 1 {
		s := sets[0]
		b.rep.uncontended = append(b.rep.uncontended, runUncontendedBoth(ctx, b.c, s.locker, s.name, b.lockPool, b.uncRate, b.o, s.trips)...)
		return
	}
	ls, names := lockers(sets)
	for _, r := range runUncontendedInterleaved(ctx, ls, names, b.lockPool, b.uncRate, b.o.stepWarmup, b.o.uncMeasure, b.o.uncRounds, b.o.maxInFlight) {
		logUncontended(r)
		b.rep.uncontended = append(b.rep.uncontended, r)
	}
}

// holdKubelock runs workload 5 with each set, without and with sessions.
func (b *benchRun) holdKubelock(ctx context.Context, sets []clientSet) error {
	for _, s := range sets {
		for _, sessions := range []bool{false, true} {
			if ctx.Err() != nil {
				break
			}
			t, err := kubelockHold(ctx, s.factory, b.c.user, lockNS, b.hold, sessions)
			if err != nil {
				return err
			}
			b.addHold(runHold(ctx, b.c, b.pw, s.name, sessions, b.lockPool, b.hold, t))
		}
	}
	return nil
}

// recordWire reports how the apiserver answered each set.
func (b *benchRun) recordWire(sets []clientSet) {
	for _, s := range sets {
		b.rep.wire = append(b.rep.wire, wireResult{System: s.name, Encoding: s.encoding, Answers: s.answers.String(), CBORShare: s.answers.cborShare()})
		logf("  %-16s apiserver answers to its lock clients: %s", s.name, s.answers)
	}
}

// handoffKubelock runs workload 3 with engine en in force.
func (b *benchRun) handoffKubelock(ctx context.Context, en kubelockEngine) error {
	return b.handoffOn(ctx, b.c, "handoff-"+string(en.e), en.name, lockClients(encJSON, nil))
}

// handoffOn runs workload 3 as system name on c's lock key with clients
// from newClient, checking the order in which the server handed it over.
func (b *benchRun) handoffOn(ctx context.Context, c *cluster, key, name string, newClient lockClientFactory) error {
	// All K contenders are benchUser: let one user queue K-1 times.
	perUser := int32(min(b.o.handoffK, locksv1alpha1.MaxWaitersLimit))
	if err := c.env.Client.Create(ctx, &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: workNS, Name: key},
		Spec: locksv1alpha1.DistributedLockSpec{MaxWaitersPerUser: &perUser}}); err != nil {
		return err
	}
	fifo, err := watchFIFO(ctx, c, key)
	if err != nil {
		return err
	}
	htr := newTrips()
	st0, _ := c.serverTimes(ctx)
	r := runHandoff(ctx, name, b.o.handoffK, b.o.handoffHold, b.o.stepWarmup, b.o.handoffMeasure, kubelockMutex(newClient, c.user, key, htr))
	r.Trips = htr.summary()
	logServerTimes(ctx, c, st0)
	r.ServerFIFOViolations, r.ServerFIFOChecked = fifo.result()
	r.ServerFIFO = true
	b.addHandoff(r)
	return nil
}
