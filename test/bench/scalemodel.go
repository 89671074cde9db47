package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"
)

// The scale model's targets: the highest sustained seed-mix rate with n
// replicas against one replica's, each replica under the same CPU quota.
var replicaTargets = map[int]float64{2: 1.8, 3: 2.5}

// replicaScale is the scale model: the seed mix on 1, 2, … replicas of
// kubelock-apiserver, each held to the same CPU quota, on one lock store.
type replicaScale struct {
	Quota   float64 // cores per replica
	Clients int
	Skipped string // why it did not run
	Runs    []replicaRun
}

// replicaRun is the seed mix on Replicas replicas.
type replicaRun struct {
	Replicas int
	Mix      *mixResult
	// Throttled is each replica's share of CFS periods over the seed mix in
	// which it used up its quota.
	Throttled []float64
}

// replicasName is the system name of the seed mix on n replicas.
func replicasName(n int) string {
	return fmt.Sprintf("kubelock-apiserver × %d (direct)", n)
}

// scaleModel runs the seed mix with 1 to --scale-replicas replicas, each in
// a cgroup of its own with --scale-quota cores; --scale-clients clients talk
// straight to the replicas, spread evenly over them.
func (b *benchRun) scaleModel(ctx context.Context, lb *lockBackend) *replicaScale {
	o := b.o
	res := &replicaScale{Quota: o.scaleQuota, Clients: o.scaleClients}
	if err := cpuQuotaUnavailable(); err != nil {
		res.Skipped = err.Error()
		logf("scale model not run: %s", res.Skipped)
		return res
	}
	logf("scale model: 1 to %d replicas of kubelock-apiserver, each held to %.2f core, %d clients straight to them", o.scaleReplicas, o.scaleQuota, o.scaleClients)
	for n := 1; n <= o.scaleReplicas && ctx.Err() == nil; n++ {
		if err := lb.holdToQuota(ctx, n, o.scaleQuota); err != nil {
			res.Skipped = fmt.Sprintf("with %d replicas: %v", n, err)
			logf("scale model stopped: %s", res.Skipped)
			return res
		}
		l, err := directLocker(ctx, lb.c.user, lb.servers[:n], o.scaleClients, o.lease)
		if err != nil {
			res.Skipped = err.Error()
			return res
		}
		m := b.mix
		m.rates, m.objects, m.maxSteps = b.scaleRates, lb.objects, o.scaleSteps
		before := lb.throttling()
		mix := runSeedMix(ctx, lb.c, l, replicasName(n), lb.free, m, lb.pw, logf)
		res.Runs = append(res.Runs, replicaRun{Replicas: n, Mix: mix, Throttled: throttledSince(before, lb.throttling())[:n]})
	}
	return res
}

// holdToQuota starts replicas until n run, and puts each in a cgroup of its
// own with a quota of cores.
func (lb *lockBackend) holdToQuota(ctx context.Context, n int, cores float64) error {
	for len(lb.servers) < n {
		if _, err := lb.addReplica(ctx); err != nil {
			return err
		}
	}
	for i := len(lb.groups); i < len(lb.servers); i++ {
		s := lb.servers[i]
		g, err := newCPUCgroup(fmt.Sprintf("kubelock-bench-%d-%s", os.Getpid(), s.Name), cores)
		if err != nil {
			return err
		}
		lb.groups = append(lb.groups, g)
		if err := g.add(s.APIServer.Pid()); err != nil {
			return err
		}
	}
	return nil
}

// throttling is each cgroup's count of throttled periods and of periods.
func (lb *lockBackend) throttling() [][2]int64 {
	out := make([][2]int64, len(lb.groups))
	for i, g := range lb.groups {
		out[i][0], out[i][1] = g.throttled()
	}
	return out
}

// throttledSince is each cgroup's share of throttled periods between two
// counts.
func throttledSince(before, after [][2]int64) []float64 {
	out := make([]float64, len(after))
	for i := range after {
		var b [2]int64
		if i < len(before) {
			b = before[i]
		}
		if periods := after[i][1] - b[1]; periods > 0 {
			out[i] = float64(after[i][0]-b[0]) / float64(periods)
		}
	}
	return out
}

// run is the result with n replicas, if it ran.
func (s *replicaScale) run(n int) *replicaRun {
	for i := range s.Runs {
		if s.Runs[i].Replicas == n {
			return &s.Runs[i]
		}
	}
	return nil
}

// targets are the scale model's rows of the Targets table: a missing run
// is reported as not run, never as met.
func (s *replicaScale) targets() []targetRow {
	one := s.run(1)
	var rows []targetRow
	for _, n := range []int{2, 3} {
		t := targetRow{target: fmt.Sprintf("%s: seed mix with %d replicas ≥ %.1f× one replica's, each held to %.2f core", sysAPIServer, n, replicaTargets[n], s.Quota)}
		r := s.run(n)
		switch {
		case s.Skipped != "" && r == nil:
			t.notRun = s.Skipped
		case r == nil || one == nil:
			t.notRun = "the run ended before it"
		case one.Mix.Bracket.Sustained <= 0:
			t.notRun = "one replica sustained no step"
		default:
			t.figure = fmt.Sprintf("%s (%s; one replica %s)", ratio(r.Mix.Bracket.Sustained, one.Mix.Bracket.Sustained), r.Mix.Bracket, one.Mix.Bracket)
			t.met = r.Mix.Bracket.Sustained >= replicaTargets[n]*one.Mix.Bracket.Sustained
		}
		rows = append(rows, t)
	}
	return rows
}

// markdown is the scale model's section of the report.
func (s *replicaScale) markdown(o options) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("\n## Scale model: kubelock-apiserver replicas under equal CPU quotas\n\n")
	if s.Skipped != "" && len(s.Runs) == 0 {
		p("**Not run:** %s.\n", s.Skipped)
		return b.String()
	}
	p("Replicas of kubelock-apiserver on one lock store (one etcd member), each in a cgroup of its own (cgroup v1: `cpu.cfs_quota_us` %d of `cpu.cfs_period_us` %d, %.2f core), started one by one: 1, then 2, then 3 run. kube-apiserver, the lock store and the bench client have no quota. %d pkg/lock clients talk straight to the replicas (client i to replica i mod n, with client certificates the replicas check against the cluster's client CA), each key always through the same client. The seed mix as above, its rate search on the steps %s writes/s (at most %d steps). Every replica keeps a watch cache of the whole store, so each one decodes every write, its own or another's.\n\n",
		int(s.Quota*cfsPeriod), cfsPeriod, s.Quota, s.Clients, strings.ReplaceAll(o.scaleRates, ",", ", "), o.scaleSteps)
	p("| replicas | seed mix (offered writes/s) | vs 1 replica | p99 at the highest sustained | CPU of each replica there (cores) | its periods throttled over the search | lock etcd CPU | kube-apiserver CPU | steps | wall |\n")
	p("|---:|---|---:|---:|---|---|---:|---:|---:|---:|\n")
	one := s.run(1)
	for _, r := range s.Runs {
		st, _ := r.Mix.best()
		var cpus, thr []string
		for i := range r.Replicas {
			cpus = append(cpus, fmt.Sprintf("%.2f", st.CPU[replicaName(i+1)]))
			thr = append(thr, fmt.Sprintf("%.0f%%", 100*r.Throttled[i]))
		}
		vs := "–"
		if one != nil {
			vs = ratio(r.Mix.Bracket.Sustained, one.Mix.Bracket.Sustained)
		}
		p("| %d | %s | %s | %s | %s | %s | %.2f | %.2f | %d | %s |\n", r.Replicas, r.Mix.Bracket, vs, ms(st.All.P99), strings.Join(cpus, ", "), strings.Join(thr, ", "),
			st.CPU[lockStoreProc], st.CPU["kube-apiserver"], len(r.Mix.Steps), r.Mix.Wall.Round(time.Second))
	}
	if s.Skipped != "" {
		p("\nStopped early: %s.\n", s.Skipped)
	}
	return b.String()
}
