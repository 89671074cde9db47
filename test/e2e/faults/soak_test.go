//go:build faults

package faults

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kubelock/kubelock/test/e2e/faults/wire"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubelock/kubelock/test/faultproxy"
	"github.com/kubelock/kubelock/test/history"
)

// The soak: eight looping clients on six locks while a seeded schedule
// injects every fault of the scenarios, one at a time, until FAULTS_SOAK has
// passed; then every history check runs over the whole run.
var _ = Describe("soak", Ordered, func() {
	It("keeps every invariant under a seeded schedule of all the faults", func(ctx SpecContext) {
		seed := time.Now().UnixNano()
		if s := os.Getenv("FAULTS_SEED"); s != "" {
			var err error
			seed, err = strconv.ParseInt(s, 10, 64)
			Expect(err).NotTo(HaveOccurred())
		}
		dur := 10 * time.Minute
		if s := os.Getenv("FAULTS_SOAK"); s != "" {
			var err error
			dur, err = time.ParseDuration(s)
			Expect(err).NotTo(HaveOccurred())
		}
		fmt.Printf("\nfault soak: seed %d (replay with FAULTS_SEED=%d), duration %s\n", seed, seed, dur)
		GinkgoWriter.Printf("fault soak: seed %d, duration %s\n", seed, dur)
		rng := rand.New(rand.NewPCG(uint64(seed), 0x736f616b))

		var keys []string
		for range 6 {
			keys = append(keys, newLock(ctx, "soak", 3, 2))
		}
		clientN := 0
		startClient := func() *lockClient {
			clientN++
			c := newClient(fmt.Sprintf("soak-c%d", clientN))
			c.do(wire.Command{Cmd: "loop", Keys: keys, N: 2, Wait: 5 * time.Second, Seed: rng.Uint64()})
			return c
		}
		var cs []*lockClient
		for range 8 {
			cs = append(cs, startClient())
		}

		// Lock writes of the soak: the proxy drops some of their responses during a drop fault.
		var dropping atomic.Bool
		proxy.SetRule(func(r *http.Request) faultproxy.Action {
			if dropping.Load() && r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/distributedlocks/soak-") && rand.IntN(4) == 0 {
				return faultproxy.DropResponse
			}
			return faultproxy.Pass
		})
		DeferCleanup(func() { proxy.SetRule(nil); proxy.SetDelay(0) })

		faults := map[string]int{}
		pause := func(lo, hi int) { // scheduled fault timing, not synchronisation
			time.Sleep(time.Duration(lo)*time.Second + time.Duration(rng.IntN((hi-lo)*1000+1))*time.Millisecond)
		}
		ready := func() { Expect(cp.ready(ctx)).To(Succeed()) }
		kinds := []string{"pause-client", "drop-responses", "delay", "etcd-member", "etcd-quorum", "apiserver", "leader-kill", "webhook-down", "clock-jump", "client-kill", "compact-defrag"}
		end := time.Now().Add(dur)
		for time.Now().Before(end) {
			k := kinds[rng.IntN(len(kinds))]
			faults[k]++
			GinkgoWriter.Printf("soak %s: %s\n", time.Until(end).Round(time.Second), k)
			switch k {
			case "pause-client":
				c := cs[rng.IntN(len(cs))]
				c.pause()
				pause(4, 7)
				c.resume()
			case "drop-responses":
				dropping.Store(true)
				pause(4, 6)
				dropping.Store(false)
			case "delay":
				proxy.SetDelay(time.Duration(50+rng.IntN(250)) * time.Millisecond)
				pause(4, 6)
				proxy.SetDelay(0)
			case "etcd-member":
				m := cp.Etcd.Members[rng.IntN(3)]
				m.Stop()
				pause(4, 8)
				Expect(m.Start(ctx)).To(Succeed())
				ready()
			case "etcd-quorum":
				i := rng.IntN(3)
				a, b := cp.Etcd.Members[i], cp.Etcd.Members[(i+1)%3]
				a.Stop()
				b.Stop()
				pause(3, 6)
				Expect(a.Start(ctx)).To(Succeed())
				Expect(b.Start(ctx)).To(Succeed())
				ready()
			case "apiserver":
				cp.APIServer().Kill()
				pause(1, 3)
				Expect(cp.APIServer().Start(ctx)).To(Succeed())
				ready()
			case "leader-kill":
				if l := leader(); l != nil {
					l.kill() // supervised: it comes back as the standby
				}
			case "webhook-down":
				for _, m := range managers {
					m.supervise(false)
					m.kill()
				}
				pause(2, 5)
				for _, m := range managers {
					m.supervise(true)
					Expect(m.start()).To(Succeed())
				}
			case "clock-jump":
				off := []string{"1h", "-1h", "30m", "-30m"}[rng.IntN(4)]
				for _, f := range offsets {
					Expect(os.WriteFile(f, []byte(off), 0o644)).To(Succeed())
				}
				pause(5, 8)
				for _, f := range offsets {
					Expect(os.WriteFile(f, []byte("0s"), 0o644)).To(Succeed())
				}
			case "client-kill":
				i := rng.IntN(len(cs))
				killClient(cs[i])
				cs[i] = startClient()
			case "compact-defrag":
				// As an operator compacts and defragments a live store: every
				// watch resuming from before the compacted revision relists.
				m := compactAndDefragment(ctx, running(cp.Etcd), history.Mono())
				Expect(m.err).NotTo(HaveOccurred(), "compaction and defragmentation: %s", m)
				GinkgoWriter.Printf("soak: %s\n", m)
			}
			pause(2, 5)
		}
		var ops int64
		for _, c := range cs {
			ops += c.do(wire.Command{Cmd: "stop"}).Ops
			c.exit()
		}
		unwatch(keys...)
		var fs []string
		for k, n := range faults {
			fs = append(fs, fmt.Sprintf("%s ×%d", k, n))
		}
		sort.Strings(fs)
		total := 0
		for _, n := range faults {
			total += n
		}
		row := check(ctx, result{Scenario: fmt.Sprintf("soak (seed %d, %s)", seed, dur), Faults: fmt.Sprintf("%d faults: %s", total, strings.Join(fs, ", ")),
			Recovery: "see the scenarios", Notes: fmt.Sprintf("%d client processes", clientN)}, "soak")
		fmt.Printf("fault soak: seed %d, %d lock operations, %d faults, 0 violations\n", seed, row.Ops, total)
	})
})
