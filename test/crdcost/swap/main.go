// Command swap compares two DistributedLock CRDs on one real kube-apiserver
// (envtest, no admission engine): it swaps the CRD's schema between them in
// turns, runs the same closed loop of status writes (acquire, renew,
// release: the seed mix's three writes) against each, and takes the
// apiserver's CPU profile during every measured window. One run, one
// apiserver, the two CRDs taking turns, so a loaded machine weighs on both
// alike.
//
//	git show <before>:config/crd/bases/locks.kubelock.io_distributedlocks.yaml > /tmp/before.yaml
//	go run ./test/crdcost/swap -baseline /tmp/before.yaml -profiles /tmp/crd-profiles
//	go -C test/bench run . --summarize-profile /tmp/crd-profiles/generated.pb.gz
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/test/crdcost"
	"github.com/kubelock/kubelock/test/testenv"
)

const crdName = "distributedlocks.locks.kubelock.io"

type options struct {
	baseline, profiles string
	rounds, writers    int
	warmup, measure    time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.baseline, "baseline", "", "CRD file to compare the generated one (config/crd/bases) with (required)")
	flag.StringVar(&o.profiles, "profiles", "", "folder for the apiserver's CPU profiles, one per CRD and round (none if empty)")
	flag.IntVar(&o.rounds, "rounds", 3, "turns per CRD")
	flag.IntVar(&o.writers, "writers", 8, "concurrent writers, each cycling its own lock: acquire, renew, release")
	flag.DurationVar(&o.warmup, "warmup", 2*time.Second, "writes before each measured window")
	flag.DurationVar(&o.measure, "measure", 10*time.Second, "measured window per CRD and round")
	flag.Parse()
	if o.baseline == "" {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(context.Background(), o); err != nil {
		fmt.Fprintln(os.Stderr, "swap:", err)
		os.Exit(1)
	}
}

// variant is one CRD's schema and what was measured with it.
type variant struct {
	name     string
	versions []apiextensionsv1.CustomResourceDefinitionVersion
	lat      map[string][]time.Duration // per write: acquire, renew, release
	writes   int
	elapsed  time.Duration
	profiles []string
}

func run(ctx context.Context, o options) error {
	env, err := testenv.Start()
	if err != nil {
		return err
	}
	defer func() { _ = env.Stop() }()
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Timeout = -1, o.measure+time.Minute
	if err := apiextensionsv1.AddToScheme(env.Scheme); err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	base, err := readVersions(o.baseline)
	if err != nil {
		return err
	}
	gen, err := readVersions(crdcost.GeneratedCRD())
	if err != nil {
		return err
	}
	vs := []*variant{{name: "baseline", versions: base}, {name: "generated", versions: gen}}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "swap-"}}
	if err := c.Create(ctx, ns); err != nil {
		return err
	}
	locks := make([]*locksv1alpha1.DistributedLock, o.writers)
	for i := range locks {
		locks[i] = &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: fmt.Sprintf("lock-%d", i)}}
		if err := c.Create(ctx, locks[i]); err != nil {
			return err
		}
	}
	if o.profiles != "" {
		if err := os.MkdirAll(o.profiles, 0o755); err != nil {
			return err
		}
	}
	for r := range o.rounds {
		// Alternate which CRD goes first, so neither always follows the other.
		order := []*variant{vs[r%2], vs[1-r%2]}
		for _, v := range order {
			if err := install(ctx, c, v.versions); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "%s round %d: %s CRD installed\n", time.Now().Format("15:04:05"), r, v.name)
			if _, _, err := loop(ctx, c, locks, o.warmup); err != nil {
				return err
			}
			var prof []byte
			var profErr error
			var wg sync.WaitGroup
			if o.profiles != "" {
				wg.Go(func() {
					prof, profErr = cs.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").
						Param("seconds", fmt.Sprint(int(o.measure.Seconds()))).DoRaw(ctx)
				})
			}
			lat, elapsed, err := loop(ctx, c, locks, o.measure)
			wg.Wait()
			if err != nil {
				return err
			}
			if profErr != nil {
				return profErr
			}
			if prof != nil {
				path := filepath.Join(o.profiles, fmt.Sprintf("%s-%d.pb.gz", v.name, r))
				if err := os.WriteFile(path, prof, 0o644); err != nil {
					return err
				}
				v.profiles = append(v.profiles, path)
			}
			if v.lat == nil {
				v.lat = map[string][]time.Duration{}
			}
			for k, ds := range lat {
				v.lat[k] = append(v.lat[k], ds...)
				v.writes += len(ds)
			}
			v.elapsed += elapsed
		}
	}
	report(o, vs)
	return nil
}

func readVersions(path string) ([]apiextensionsv1.CustomResourceDefinitionVersion, error) {
	crd, err := crdcost.ReadCRD(path)
	if err != nil {
		return nil, err
	}
	if crd.Name != crdName {
		return nil, fmt.Errorf("%s: not the CRD %s", path, crdName)
	}
	return crd.Spec.Versions, nil
}

// install makes versions the CRD's and waits until the apiserver serves
// them: a dry-run write that changes a held lock's holder identity is
// refused exactly when the installed rules refuse it.
func install(ctx context.Context, c client.Client, versions []apiextensionsv1.CustomResourceDefinitionVersion) error {
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := c.Get(ctx, client.ObjectKey{Name: crdName}, crd); err != nil {
		return err
	}
	crd.Spec.Versions = versions
	if err := c.Update(ctx, crd); err != nil {
		return err
	}
	refuses := identityRule(versions)
	probe := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: "default", GenerateName: "probe-"}}
	if err := c.Create(ctx, probe); err != nil {
		return err
	}
	if err := acquire(ctx, c, probe); err != nil {
		return err
	}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p := probe.DeepCopy()
		p.Status.Holder.Identity = "someone-else"
		err := c.Status().Update(ctx, p, client.DryRunAll)
		return (err != nil) == refuses, nil
	})
	if err != nil {
		return fmt.Errorf("the apiserver did not start serving the new schema: %w", err)
	}
	// Let the apiserver finish rebuilding its OpenAPI and handlers.
	time.Sleep(2 * time.Second)
	return nil
}

// identityRule reports whether versions keep a holder's identity with a CEL rule.
func identityRule(versions []apiextensionsv1.CustomResourceDefinitionVersion) bool {
	id := versions[0].Schema.OpenAPIV3Schema.Properties["status"].Properties["holder"].Properties["identity"]
	return slices.ContainsFunc(id.XValidations, func(r apiextensionsv1.ValidationRule) bool { return r.Rule == "self == oldSelf" })
}

var seq struct {
	sync.Mutex
	n int
}

func holding() locksv1alpha1.LockHolder {
	seq.Lock()
	seq.n++
	n := seq.n
	seq.Unlock()
	now := metav1.NowMicro()
	return locksv1alpha1.LockHolder{Identity: "bench", User: "bench", LeaseID: fmt.Sprintf("lease-%016d", n),
		RequestID: fmt.Sprintf("req-%d", n), LeaseDurationSeconds: 30, AcquireTime: now, RenewTime: &now}
}

func acquire(ctx context.Context, c client.Client, l *locksv1alpha1.DistributedLock) error {
	token, err := locksv1alpha1.NextFencingToken(l.ResourceVersion)
	if err != nil {
		return err
	}
	l.Acquire(holding(), token)
	return c.Status().Update(ctx, l)
}

// loop has every writer cycle its lock (acquire, renew, release, each a
// status update on the previous response) for d.
func loop(ctx context.Context, c client.Client, locks []*locksv1alpha1.DistributedLock, d time.Duration) (map[string][]time.Duration, time.Duration, error) {
	steps := []struct {
		name string
		do   func(*locksv1alpha1.DistributedLock) error
	}{
		{"acquire", func(l *locksv1alpha1.DistributedLock) error { return acquire(ctx, c, l) }},
		{"renew", func(l *locksv1alpha1.DistributedLock) error {
			now := metav1.NowMicro()
			l.Status.Holder.RenewTime = &now
			return c.Status().Update(ctx, l)
		}},
		{"release", func(l *locksv1alpha1.DistributedLock) error {
			l.EndHolding(locksv1alpha1.EndReasonReleased, "bench", metav1.NowMicro())
			return c.Status().Update(ctx, l)
		}},
	}
	lat := make([]map[string][]time.Duration, len(locks))
	errs := make([]error, len(locks))
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for i, l := range locks {
		lat[i] = map[string][]time.Duration{}
		wg.Go(func() {
			for s := 0; time.Now().Before(deadline) || s%3 != 0; s++ {
				st := steps[s%3]
				t := time.Now()
				if err := st.do(l); err != nil {
					errs[i] = fmt.Errorf("%s: %w", st.name, err)
					return
				}
				lat[i][st.name] = append(lat[i][st.name], time.Since(t))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	all := map[string][]time.Duration{}
	for _, m := range lat {
		for k, v := range m {
			all[k] = append(all[k], v...)
		}
	}
	return all, elapsed, errors.Join(errs...)
}

func report(o options, vs []*variant) {
	fmt.Printf("\n%d writers, each cycling its own lock (acquire, renew, release); %d rounds of %v per CRD, taking turns; no admission engine\n\n",
		o.writers, o.rounds, o.measure)
	fmt.Printf("| CRD | writes/s | acquire p50 | acquire p99 | renew p50 | renew p99 | release p50 | release p99 |\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, v := range vs {
		fmt.Printf("| %s | %.0f", v.name, float64(v.writes)/v.elapsed.Seconds())
		for _, k := range []string{"acquire", "renew", "release"} {
			fmt.Printf(" | %v | %v", pct(v.lat[k], 0.50), pct(v.lat[k], 0.99))
		}
		fmt.Println(" |")
	}
	fmt.Printf("\nratio generated/baseline: writes/s %.2f", (float64(vs[1].writes)/vs[1].elapsed.Seconds())/(float64(vs[0].writes)/vs[0].elapsed.Seconds()))
	for _, k := range []string{"acquire", "renew", "release"} {
		fmt.Printf(", %s p50 %.2f p99 %.2f", k, ratio(vs, k, 0.50), ratio(vs, k, 0.99))
	}
	fmt.Println()
	for _, v := range vs {
		if len(v.profiles) > 0 {
			fmt.Printf("\napiserver profiles, %s: %v\n", v.name, v.profiles)
		}
	}
}

func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(ds))
	return s[int(p*float64(len(s)-1))].Round(100 * time.Microsecond)
}

func ratio(vs []*variant, k string, p float64) float64 {
	return float64(pct(vs[1].lat[k], p)) / float64(pct(vs[0].lat[k], p))
}
