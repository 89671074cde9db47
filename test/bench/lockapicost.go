package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/lockapi"
	"github.com/kubelock/kubelock/test/testenv"
)

// lockPlane is a control plane whose lock API kubelock-apiserver serves
// through the APIService, from an etcd of its own, storing one encoding.
type lockPlane struct {
	encoding string
	env      *testenv.Env
	server   *lockapi.Server
	// procs: kube-apiserver and its etcd, the lock apiserver and its etcd.
	procs path
	admin *rest.Config
}

type lockPlanes []*lockPlane

// Names of the variants the gate compares.
func proxiedVariant(encoding string) string {
	return "DistributedLock status through kube-apiserver to kubelock-apiserver, " + encoding + " in its etcd"
}

const (
	tokenSuffix      = ", service-account token"
	directVariantFmt = "DistributedLock status straight to kubelock-apiserver, %s in its etcd" + tokenSuffix
	writerAccount    = "writer"
)

// startLockPlanes starts one lock plane per storage encoding, JSON first.
// Stop them with stop, also after an error.
func startLockPlanes(ctx context.Context) (lockPlanes, error) {
	dir, err := os.MkdirTemp("", "kubelock-write-cost-")
	if err != nil {
		return nil, err
	}
	bin, err := lockapi.Build(ctx, dir)
	if err != nil {
		return nil, err
	}
	var planes lockPlanes
	for _, enc := range []string{"json", "cbor"} {
		p, err := startLockPlane(ctx, filepath.Join(dir, enc), bin, enc)
		if p != nil {
			planes = append(planes, p)
		}
		if err != nil {
			return planes, err
		}
	}
	return planes, nil
}

func startLockPlane(ctx context.Context, dir, bin, encoding string) (*lockPlane, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	p := &lockPlane{encoding: encoding}
	var err error
	if p.env, err = lockapi.ControlPlane(); err != nil {
		return nil, err
	}
	p.procs = clusterPath(p.env)
	if p.server, err = lockapi.Start(ctx, p.env, bin, dir, lockapi.Options{Name: "kubelock-apiserver-" + encoding, StorageEncoding: encoding}); err != nil {
		return p, err
	}
	p.procs[roleLockAPI] = proc{name: "kubelock-apiserver", pid: p.server.APIServer.Pid()}
	p.procs[roleLockEtcd] = proc{name: "etcd", pid: p.server.Etcd.Members[0].Running().Pid()}
	p.admin = rest.CopyConfig(p.env.Config)
	p.admin.QPS = -1
	return p, p.server.Register(ctx, p.env)
}

func (ps lockPlanes) stop() {
	for _, p := range ps {
		if p.server != nil {
			_ = p.server.Stop()
		}
		if p.env != nil {
			_ = p.env.Stop()
		}
	}
}

// variants are a busy lock's status renewals on p: through kube-apiserver as
// its administrator (as the CRD's variants write), and with a service
// account's token through kube-apiserver and straight to the lock apiserver
// (which checks the token with a TokenReview and the verb with a
// SubjectAccessReview, both cached; kube-apiserver answers them, so it is
// on that path too); on the JSON plane also a Lease on its kube-apiserver.
func (p *lockPlane) variants(ctx context.Context) ([]costVariant, error) {
	cs, err := kubernetes.NewForConfig(p.admin)
	if err != nil {
		return nil, err
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: costNS}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	token, err := writerToken(ctx, cs)
	if err != nil {
		return nil, err
	}
	bearer := &rest.Config{Host: p.admin.Host, BearerToken: token, QPS: -1, TLSClientConfig: rest.TLSClientConfig{CAData: p.admin.CAData}}
	proxied, direct := p.procs, p.procs
	proxied[roleEtcd], direct[roleEtcd] = proc{}, proc{}
	var out []costVariant
	for _, v := range []struct {
		name, lock string
		cfg        *rest.Config
		path       path
	}{
		{proxiedVariant(p.encoding), "cost", p.admin, proxied},
		{proxiedVariant(p.encoding) + tokenSuffix, "cost-token", bearer, proxied},
		{fmt.Sprintf(directVariantFmt, p.encoding), "cost-direct", p.server.Direct(bearer), direct},
	} {
		if p.encoding != "json" && v.lock == "cost-token" {
			continue // the token's cost does not depend on the encoding
		}
		// Only the holder renews: the writer fills its own lock, through
		// kube-apiserver (pkg/lock learns its user with a SelfSubjectReview,
		// which only kube-apiserver serves).
		filler := p.admin
		if v.cfg != p.admin {
			filler = bearer
		}
		lc, err := lock.New(filler, lock.WithNamespace(costNS), lock.WithIdentity("writer-0"), lock.WithoutAutoRenew(), lock.WithAutoCreate())
		if err != nil {
			return nil, err
		}
		fillDyn, err := dynamic.NewForConfig(filler)
		if err != nil {
			return nil, err
		}
		held, err := fillLock(ctx, lc, fillDyn, v.lock, fullRounds)
		if err != nil {
			return nil, err
		}
		dyn, err := dynamic.NewForConfig(v.cfg)
		if err != nil {
			return nil, err
		}
		out = append(out, costVariant{name: v.name, path: v.path, write: statusRenewal(dyn.Resource(lockGVR).Namespace(costNS), held, false, false, metav1.UpdateOptions{})})
	}
	if p.encoding == "json" {
		lease, err := leaseRenewal(ctx, cs.CoordinationV1().Leases(costNS))
		if err != nil {
			return nil, err
		}
		leases := p.procs
		leases[roleLockAPI], leases[roleLockEtcd] = proc{}, proc{}
		out = append(out, costVariant{name: leaseVariant + " on that kube-apiserver", path: leases, write: lease})
	}
	return out, nil
}

// writerToken is a token of service account writer, bound to the lock-user role.
func writerToken(ctx context.Context, cs kubernetes.Interface) (string, error) {
	if _, err := cs.CoreV1().ServiceAccounts(costNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: writerAccount}}, metav1.CreateOptions{}); err != nil {
		return "", err
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "write-cost-writer"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: testenv.LockUserRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: costNS, Name: writerAccount}},
	}, metav1.CreateOptions{}); err != nil {
		return "", err
	}
	tr, err := cs.CoreV1().ServiceAccounts(costNS).CreateToken(ctx, writerAccount,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptrTo(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	return tr.Status.Token, nil
}

// printGate says whether the lock apiserver's write costs at most half of
// the CRD's, every process on its path summed, over all windows and round
// by round (each round's windows ran back to back): against the CRD with
// no admission (the floor of the CRD path) and with kubelock's policy (its
// rules in kube-apiserver, as the lock apiserver runs them in-process). And
// the targets against a Lease write.
func printGate(variants []costVariant, res []costResult) {
	byName := map[string]*costResult{}
	for i, v := range variants {
		byName[v.name] = &res[i]
	}
	leaseBy, lease := byName[leaseVariant].perWrite()
	fmt.Printf("\nGate (a status write through the APIService costs at most half of the CRD's, every process on the path summed):\n\n")
	for _, enc := range []string{"json", "cbor"} {
		r := byName[proxiedVariant(enc)]
		by, total := r.perWrite()
		for _, against := range []struct{ name, variant string }{{"the CRD without admission", crdVariant}, {"the CRD with kubelock's policy", policyVariant}} {
			crd := byName[against.variant]
			_, crdTotal := crd.perWrite()
			var perRound []float64
			for k := range min(len(r.rounds), len(crd.rounds)) {
				perRound = append(perRound, r.rounds[k]/crd.rounds[k])
			}
			slices.Sort(perRound)
			verdict := "met"
			if total > crdTotal/2 {
				verdict = "NOT met"
			}
			fmt.Printf("- %s in the lock etcd, against %s: %.2f ms against %.2f ms = %s (rounds: median %.2f×, %.2f–%.2f×): %s\n",
				enc, against.name, 1000*total, 1000*crdTotal, ratio(total, crdTotal), perRound[len(perRound)/2], perRound[0], perRound[len(perRound)-1], verdict)
		}
		fmt.Printf("- %s, against a Lease write: every process %s (target ≤ 1.5×); kube-apiserver proxying %s of its CPU for a Lease write (target ≤ 0.6×)\n",
			enc, ratio(total, lease), ratio(by[roleKube], leaseBy[roleKube]))
	}
}

// serverProfile is a CPU profile to take of one server while write runs
// over and over.
type serverProfile struct {
	name  string
	write func(context.Context) (int, error)
	fetch func(ctx context.Context, d time.Duration, path string) error
}

// profiles are kube-apiserver's and kubelock-apiserver's while the lock
// apiserver takes the lock's status writes through the APIService.
func (p *lockPlane) profiles(write func(context.Context) (int, error)) []serverProfile {
	lockAPI := p.server.Direct(p.admin)
	return []serverProfile{
		{"kube-apiserver proxying to kubelock-apiserver (" + p.encoding + ")", write, pprofOf(p.admin)},
		{"kubelock-apiserver (" + p.encoding + ")", write, pprofOf(lockAPI)},
	}
}

// pprofOf fetches a CPU profile from the server cfg reaches.
func pprofOf(cfg *rest.Config) func(ctx context.Context, d time.Duration, path string) error {
	return func(ctx context.Context, d time.Duration, path string) error {
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return err
		}
		body, err := cs.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").
			Param("seconds", strconv.Itoa(int(d.Seconds()))).Timeout(d + 30*time.Second).DoRaw(ctx)
		if err != nil {
			return err
		}
		return os.WriteFile(path, body, 0o644)
	}
}

// take profiles the server for 10 s while writing, and prints the summary.
func (s serverProfile) take(ctx context.Context) error {
	path := filepath.Join(os.TempDir(), "kubelock-write-cost-"+slug(s.name)+".pprof")
	errc := make(chan error, 1)
	go func() { errc <- s.fetch(ctx, 10*time.Second, path) }()
	for wrote := 0; ; wrote++ {
		select {
		case err := <-errc:
			if err != nil {
				return err
			}
			fmt.Printf("\n%s while it took %d writes (%s):\n\n%s", s.name, wrote, path, profileSummary(path))
			return nil
		default:
		}
		if _, err := s.write(ctx); err != nil {
			return err
		}
	}
}

// slug is name with every run of other characters than letters and digits as one dash.
func slug(name string) string {
	var b []rune
	for _, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			b = append(b, r)
		case len(b) > 0 && b[len(b)-1] != '-':
			b = append(b, '-')
		}
	}
	return string(b)
}
