package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kubelock/kubelock/test/testenv"
)

// The write-cost experiment (--write-cost N) asks what one status write of a
// DistributedLock costs the processes that serve it next to one write of a
// Lease, and which part of the CRD's schema or of the request pays for the
// difference. It starts a control plane and binds kubelock's admission to
// two locks only, by a label: the webhook, served by the operator binary
// running as a replica that does not lead (so its process does the
// webhook's work alone), and the policy. It installs copies of the
// DistributedLock CRD under other groups (the same schema without its CEL
// rules; a status the apiserver neither validates nor prunes) and the bare
// CRD (a Lease's fields), fills a lock's status the way pkg/lock does
// (acquisitions and releases until recentAcquisitions is full, then one
// held; and a lock held once). Two more control planes serve the lock API
// from kubelock-apiserver instead, one storing JSON in its etcd and one
// CBOR (a group version is served by a CRD or by an APIService, never both,
// so each backend needs its own kube-apiserver). Then it renews each
// variant N times, closed loop, one writer, the variants interleaved in
// blocks: the client's latency, and the CPU time per write from /proc of
// every process on the write's path.

// role is a process's part on a write's path.
type role int

const (
	roleKube role = iota
	roleEtcd
	roleOperator
	roleLockAPI
	roleLockEtcd
	nRoles
)

var roleNames = [nRoles]string{"kube-apiserver", "its etcd", "operator (webhook)", "kubelock-apiserver", "lock etcd"}

// path are the processes that serve a write, by role; a zero pid is not on it.
type path [nRoles]proc

func (p path) cpu() (c [nRoles]float64) {
	for r, pr := range p {
		if pr.pid != 0 {
			c[r] = pr.cpu()
		}
	}
	return c
}

type costVariant struct {
	name  string
	path  path
	write func(ctx context.Context) (bytes int, err error)
}

// writeCost runs the experiment with at least n writes of each variant and
// prints its tables, the gate's verdict and the servers' profiles.
func writeCost(ctx context.Context, n int) error {
	fmt.Printf("Load average at the start: %s\n", loadAvg())
	env, err := testenv.Start()
	if err != nil {
		return err
	}
	defer func() { _ = env.Stop() }()
	cc, err := newCostCluster(ctx, env)
	if cc != nil {
		defer cc.stop()
	}
	if err != nil {
		return err
	}
	variants, err := cc.variants(ctx)
	if err != nil {
		return err
	}
	planes, err := startLockPlanes(ctx)
	defer planes.stop()
	if err != nil {
		return err
	}
	for _, p := range planes.all {
		vs, err := p.variants(ctx)
		if err != nil {
			return err
		}
		variants = append(variants, vs...)
	}
	res, err := measureCost(ctx, variants, n)
	if err != nil {
		return err
	}
	printCost(variants, res, n)
	printGate(variants, res)
	if err := pairCost(ctx, n, cc.path[roleKube], cc.admin, cc.cs, costNS); err != nil {
		return err
	}
	if err := handoffCost(ctx, n, cc.admin, cc.cs, costNS); err != nil {
		return err
	}
	return takeProfiles(ctx, cc, variants, planes.all[0])
}

// takeProfiles prints where kube-apiserver's time goes while it takes the
// shipped lock's writes (without admission), and the operator's while it
// serves their webhook; and where kube-apiserver's and kubelock-apiserver's
// go while the lock apiserver takes them through the APIService.
func takeProfiles(ctx context.Context, cc *costCluster, variants []costVariant, plane *lockPlane) error {
	var profiles []serverProfile
	for _, v := range variants {
		switch v.name {
		case crdVariant:
			profiles = append(profiles, serverProfile{"kube-apiserver, CRD", v.write, pprofOf(cc.admin)})
		case webhookVariant:
			profiles = append(profiles, serverProfile{"the operator serving the webhook", v.write, cc.op.managerProfile})
		case proxiedVariant(plane.encoding):
			profiles = append(profiles, plane.profiles(v.write)...)
		}
	}
	for _, p := range profiles {
		if err := p.take(ctx); err != nil {
			return err
		}
	}
	return nil
}

// costResult is what one variant's windows measured.
type costResult struct {
	lat   []time.Duration
	bytes int
	// cpu is the CPU seconds of each process on the path, beyond its idle
	// rate, over every window; writes the writes they took.
	cpu    [nRoles]float64
	writes int
	// writing is the time the windows spent writing (their settling not
	// counted): one closed-loop writer's rate is writes over it.
	writing time.Duration
	// rounds are the per-write totals of each round's window, in order.
	rounds []float64
}

// rate is the writes per second of the closed-loop writer while it wrote.
func (r *costResult) rate() float64 { return float64(r.writes) / r.writing.Seconds() }

func (r *costResult) perWrite() (by [nRoles]float64, total float64) {
	for i, c := range r.cpu {
		by[i] = c / float64(r.writes)
		total += by[i]
	}
	return by, total
}

// Each round gives every variant a window of writes, then lets its servers
// settle (their watch caches, garbage collection and other work a write
// leaves behind run after it returns) before their CPU is read again, so a
// window is charged for its own writes' work and none of another's.
const (
	costWindow = 2 * time.Second
	costSettle = 300 * time.Millisecond
)

// measureCost runs windows of each variant in turn until every variant
// took at least n writes, and charges each window the CPU its path's
// processes used beyond their idle rates.
func measureCost(ctx context.Context, variants []costVariant, n int) ([]costResult, error) {
	idle, err := idleRates(ctx, variants, 3*time.Second)
	if err != nil {
		return nil, err
	}
	res := make([]costResult, len(variants))
	for slices.ContainsFunc(res, func(r costResult) bool { return r.writes < n }) {
		for i, v := range variants {
			c0, t0 := v.path.cpu(), time.Now()
			writes := 0
			for ; time.Since(t0) < costWindow; writes++ {
				t := time.Now()
				b, err := v.write(ctx)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", v.name, err)
				}
				res[i].lat = append(res[i].lat, time.Since(t))
				res[i].bytes = b
			}
			res[i].writing += time.Since(t0)
			if err := sleepCtx(ctx, costSettle); err != nil {
				return nil, err
			}
			c1, elapsed := v.path.cpu(), time.Since(t0).Seconds()
			round := 0.0
			for r := range c1 {
				used := c1[r] - c0[r] - idle[v.path[r].pid]*elapsed
				res[i].cpu[r] += used
				round += used
			}
			res[i].writes += writes
			res[i].rounds = append(res[i].rounds, round/float64(writes))
		}
	}
	return res, nil
}

// idleRates are the CPU seconds per second each process on a path uses while
// nothing is written.
func idleRates(ctx context.Context, variants []costVariant, d time.Duration) (map[int]float64, error) {
	procs := map[int]proc{}
	for _, v := range variants {
		for _, p := range v.path {
			if p.pid != 0 {
				procs[p.pid] = p
			}
		}
	}
	before := map[int]float64{}
	for pid, p := range procs {
		before[pid] = p.cpu()
	}
	t0 := time.Now()
	if err := sleepCtx(ctx, d); err != nil {
		return nil, err
	}
	elapsed := time.Since(t0).Seconds()
	rates := map[int]float64{}
	for pid, p := range procs {
		rates[pid] = (p.cpu() - before[pid]) / elapsed
	}
	return rates, nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// printCost prints the table and returns each variant's CPU per write.
func printCost(variants []costVariant, res []costResult, n int) map[string]float64 {
	fmt.Printf("\nOne writer, closed loop, at least %d writes per variant in interleaved windows of %s (each followed by %s for its servers to settle); no admission webhook or policy where a row does not name one. The operator runs only for the webhook's row, as a replica that does not lead: it serves the webhook, and the controller, the leader's, runs nowhere (the lock apiserver's would be the same). Body: what the client sends (JSON; CBOR where the client speaks it). writes/s: the one writer's rate over its windows. CPU: ms per write of each process on the path (blank: not on it), from /proc over the windows, beyond each process's idle rate; load average at the end %s.\n\n",
		n, costWindow, costSettle, loadAvg())
	fmt.Printf("| write | body bytes | writes/s | p50 ms | p99 ms | %s | total | vs Lease | vs CRD |\n|---|---:|---:|---:|---:|%s---:|---:|---:|\n", strings.Join(roleNames[:], " | "), strings.Repeat("---:|", int(nRoles)))
	base := map[string]float64{}
	for i, v := range variants {
		_, base[v.name] = res[i].perWrite()
	}
	for i, v := range variants {
		d := summarize(res[i].lat)
		by, total := res[i].perWrite()
		cells := make([]string, nRoles)
		for r := range by {
			if v.path[r].pid != 0 {
				cells[r] = fmt.Sprintf("%.2f", 1000*by[r])
			}
		}
		fmt.Printf("| %s | %d | %.0f | %s | %s | %s | %.2f | %s | %s |\n", v.name, res[i].bytes, res[i].rate(), ms(d.P50), ms(d.P99), strings.Join(cells, " | "),
			1000*total, ratio(total, base[leaseVariant]), ratio(total, base[crdVariant]))
	}
	return base
}

// The variants the others are compared with, and the gate's: the CRD with
// no admission (the first row, "vs CRD"), with kubelock's webhook (its
// default engine: the CRD path as kubelock ships it) and with its policy.
const (
	crdVariant     = "DistributedLock status (CRD as shipped, no admission)"
	webhookVariant = "DistributedLock status, CRD as shipped and kubelock's webhook (the operator serving it on the path)"
	policyVariant  = "DistributedLock status, CRD as shipped and kubelock's ValidatingAdmissionPolicy"
	leaseVariant   = "Lease (coordination.k8s.io/v1, protobuf)"
	costNS         = "write-cost"
	// fullRounds of acquire and release fill recentAcquisitions (8) and one more.
	fullRounds = 9
)
