package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	locksv1alpha1 "github.com/kubelock/kubelock/api/v1alpha1"
	"github.com/kubelock/kubelock/pkg/lock"
	"github.com/kubelock/kubelock/test/lockapi"
	"github.com/kubelock/kubelock/test/testenv"
)

// lockPlane is a control plane whose lock API kubelock-apiserver serves
// through the APIService, from an etcd of its own, storing one encoding;
// it serves CBOR too (its CBORServingAndStorage gate on), for the clients
// that speak it.
type lockPlane struct {
	encoding string
	env      *testenv.Env
	server   *lockapi.Server
	// procs: kube-apiserver and its etcd, the lock apiserver and its etcd.
	procs path
	admin *rest.Config
}

// lockPlanes are the lock planes and the folder of their files.
type lockPlanes struct {
	dir string
	all []*lockPlane
}

// Names of the variants the gate compares.
func proxiedVariant(encoding string) string {
	return "DistributedLock status through kube-apiserver to kubelock-apiserver, " + encoding + " in its etcd"
}

const (
	tokenSuffix      = ", service-account token"
	cborSuffix       = ", client speaking CBOR"
	stripSuffix      = ", managedFields not sent"
	directVariantFmt = "DistributedLock status straight to kubelock-apiserver, %s in its etcd" + tokenSuffix
	writerAccount    = "writer"
)

// startLockPlanes starts one lock plane per storage encoding, JSON first.
// Stop them with stop, also after an error.
func startLockPlanes(ctx context.Context) (*lockPlanes, error) {
	dir, err := os.MkdirTemp("", "kubelock-write-cost-")
	if err != nil {
		return nil, err
	}
	planes := &lockPlanes{dir: dir}
	bin, err := lockapi.Build(ctx, dir)
	if err != nil {
		return planes, err
	}
	for _, enc := range []string{"json", "cbor"} {
		p, err := startLockPlane(ctx, filepath.Join(dir, enc), bin, enc)
		if p != nil {
			planes.all = append(planes.all, p)
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
	if p.server, err = lockapi.Start(ctx, p.env, bin, dir, lockapi.Options{Name: "kubelock-apiserver-" + encoding, StorageEncoding: encoding,
		Args: []string{"--feature-gates=" + cborGate + "=true"}}); err != nil {
		return p, err
	}
	p.procs[roleLockAPI] = proc{name: "kubelock-apiserver", pid: p.server.APIServer.Pid()}
	p.procs[roleLockEtcd] = proc{name: "etcd", pid: p.server.Etcd.Members[0].Running().Pid()}
	p.admin = rest.CopyConfig(p.env.Config)
	p.admin.QPS = -1
	return p, p.server.Register(ctx, p.env)
}

func (ps *lockPlanes) stop() {
	if ps == nil {
		return
	}
	for _, p := range ps.all {
		if p.server != nil {
			_ = p.server.Stop()
		}
		if p.env != nil {
			_ = p.env.Stop()
		}
	}
	_ = os.RemoveAll(ps.dir)
}

// lockWrite is a variant of the busy lock's status renewal on a lock plane:
// of lock, as cfg's user, through path; in CBOR both ways when cbor.
type lockWrite struct {
	name, lock string
	cfg        *rest.Config
	path       path
	cbor       bool
	// strip sends the write without the object's managedFields, which a
	// status write cannot change (the field manager takes the stored ones).
	strip bool
}

// variants are a busy lock's status renewals on p: through kube-apiserver as
// its administrator (as the CRD's variants write), and with a service
// account's token through kube-apiserver and straight to the lock apiserver
// (which checks the token with a TokenReview and the verb with a
// SubjectAccessReview, both cached; kube-apiserver answers them, so it is
// on that path too); each also with a client that speaks CBOR; on the JSON
// plane also a Lease on its kube-apiserver.
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
	var out []costVariant
	for _, w := range p.writes(bearer) {
		v, err := p.variant(ctx, w, bearer)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	if p.encoding != "json" {
		return out, nil
	}
	lease, err := leaseRenewal(ctx, cs.CoordinationV1().Leases(costNS))
	if err != nil {
		return nil, err
	}
	leases := p.procs
	leases[roleLockAPI], leases[roleLockEtcd] = proc{}, proc{}
	return append(out, costVariant{name: leaseVariant + " on that kube-apiserver", path: leases, write: lease}), nil
}

// writes are p's lock writes: through kube-apiserver as its administrator
// and, on the JSON plane, with the token (its cost does not depend on the
// encoding); straight with the token; each also in CBOR.
func (p *lockPlane) writes(bearer *rest.Config) []lockWrite {
	proxied, direct := p.procs, p.procs
	proxied[roleEtcd], direct[roleEtcd] = proc{}, proc{}
	ws := []lockWrite{{name: proxiedVariant(p.encoding), lock: "cost", cfg: p.admin, path: proxied}}
	if p.encoding == "json" {
		ws = append(ws, lockWrite{name: proxiedVariant(p.encoding) + tokenSuffix, lock: "cost-token", cfg: bearer, path: proxied})
	}
	straight := fmt.Sprintf(directVariantFmt, p.encoding)
	ws = append(ws,
		lockWrite{name: proxiedVariant(p.encoding) + cborSuffix, lock: "cost-cbor", cfg: p.admin, path: proxied, cbor: true},
		lockWrite{name: straight, lock: "cost-direct", cfg: p.server.Direct(bearer), path: direct},
		lockWrite{name: straight + cborSuffix, lock: "cost-direct-cbor", cfg: p.server.Direct(bearer), path: direct, cbor: true},
	)
	if p.encoding == "json" {
		ws = append(ws, lockWrite{name: straight + stripSuffix, lock: "cost-direct-strip", cfg: p.server.Direct(bearer), path: direct, strip: true})
	}
	return ws
}

// variant fills w's lock as pkg/lock leaves a busy one and renews it. Only
// the holder renews: the writer fills its own lock, through kube-apiserver
// (pkg/lock learns its user with a SelfSubjectReview, which only
// kube-apiserver serves).
func (p *lockPlane) variant(ctx context.Context, w lockWrite, bearer *rest.Config) (costVariant, error) {
	filler := p.admin
	if w.cfg != p.admin {
		filler = bearer
	}
	lc, err := lock.New(filler, lock.WithNamespace(costNS), lock.WithIdentity("writer-0"), lock.WithoutAutoRenew(), lock.WithAutoCreate())
	if err != nil {
		return costVariant{}, err
	}
	fillDyn, err := dynamic.NewForConfig(filler)
	if err != nil {
		return costVariant{}, err
	}
	held, err := fillLock(ctx, lc, fillDyn, w.lock, fullRounds)
	if err != nil {
		return costVariant{}, err
	}
	v := costVariant{name: w.name, path: w.path}
	if w.cbor {
		v.write, err = cborStatusRenewal(w.cfg, held)
		return v, err
	}
	dyn, err := dynamic.NewForConfig(w.cfg)
	if err != nil {
		return costVariant{}, err
	}
	v.write = statusRenewal(dyn.Resource(lockGVR).Namespace(costNS), held, w.strip, false, metav1.UpdateOptions{})
	return v, nil
}

// cborStatusRenewal renews the holder of cur as statusRenewal does, in CBOR
// both ways; the size is that of the CBOR the client sends.
func cborStatusRenewal(cfg *rest.Config, cur *unstructured.Unstructured) (func(context.Context) (int, error), error) {
	scheme, err := lockScheme()
	if err != nil {
		return nil, err
	}
	rc, enc, err := cborRESTClient(cfg, scheme)
	if err != nil {
		return nil, err
	}
	l := &locksv1alpha1.DistributedLock{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(cur.Object, l); err != nil {
		return nil, err
	}
	return func(ctx context.Context) (int, error) {
		next := l.DeepCopy()
		now := metav1.NowMicro()
		next.Status.Holder.RenewTime = &now
		b, err := runtime.Encode(enc, next)
		if err != nil {
			return 0, err
		}
		got := &locksv1alpha1.DistributedLock{}
		if err := rc.Put().Namespace(l.Namespace).Resource("distributedlocks").Name(l.Name).SubResource("status").
			SetHeader("Content-Type", runtime.ContentTypeCBOR).Body(b).Do(ctx).Into(got); err != nil {
			return 0, err
		}
		l = got
		return len(b), nil
	}, nil
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

// gateCRDs are the CRD paths the lock apiserver is held to: as kubelock
// ships it (the webhook, its default engine), with its other engine (the
// policy: the rules in kube-apiserver, as the lock apiserver runs them
// in-process), and with no admission at all (the floor of any CRD path).
var gateCRDs = []namedVariant{
	{"the CRD with kubelock's webhook (as shipped)", webhookVariant},
	{"the CRD with kubelock's policy", policyVariant},
	{"the CRD without admission", crdVariant},
}

// namedVariant is a variant and its name in the gate's table.
type namedVariant struct{ name, variant string }

// gateRows are the lock apiserver's paths: through kube-apiserver and
// straight, for each storage encoding.
func gateRows() []namedVariant {
	var rows []namedVariant
	for _, enc := range []string{"json", "cbor"} {
		proxied, straight := proxiedVariant(enc), fmt.Sprintf(directVariantFmt, enc)
		rows = append(rows, namedVariant{"through kube-apiserver, " + enc + " in its etcd", proxied})
		if enc == "json" {
			rows = append(rows, namedVariant{"through kube-apiserver, json in its etcd" + tokenSuffix, proxied + tokenSuffix})
		}
		rows = append(rows,
			namedVariant{"through kube-apiserver, " + enc + " in its etcd" + cborSuffix, proxied + cborSuffix},
			namedVariant{"straight, " + enc + " in its etcd" + tokenSuffix, straight},
			namedVariant{"straight, " + enc + " in its etcd" + tokenSuffix + cborSuffix, straight + cborSuffix})
		if enc == "json" {
			rows = append(rows, namedVariant{"straight, json in its etcd" + tokenSuffix + stripSuffix, straight + stripSuffix})
		}
	}
	return rows
}

// relative is r's CPU per write, every process on its path summed, against
// crd's: over every window, and the median and range of the ratios round
// by round (each round's windows ran back to back).
type relative struct{ all, median, lo, hi float64 }

func relativeTo(r, crd *costResult) relative {
	_, total := r.perWrite()
	_, crdTotal := crd.perWrite()
	var perRound []float64
	for k := range min(len(r.rounds), len(crd.rounds)) {
		perRound = append(perRound, r.rounds[k]/crd.rounds[k])
	}
	slices.Sort(perRound)
	return relative{all: total / crdTotal, median: perRound[len(perRound)/2], lo: perRound[0], hi: perRound[len(perRound)-1]}
}

func (x relative) String() string {
	return fmt.Sprintf("%.2f× (rounds: median %.2f×, %.2f–%.2f×)", x.all, x.median, x.lo, x.hi)
}

// printGate prints each lock apiserver path's cost against each CRD path's
// and says whether the gate is met: a status write through the APIService
// costs at most half of the CRD's, every process on either path summed.
// And the lock apiserver's targets against a Lease write: every process on
// its path at most 1.5× a Lease write's, kube-apiserver's proxying at most
// 0.6× of kube-apiserver's CPU for one.
func printGate(variants []costVariant, res []costResult) {
	byName := map[string]*costResult{}
	for i, v := range variants {
		byName[v.name] = &res[i]
	}
	fmt.Printf("\nGate (a status write through the APIService costs at most half of the CRD's, every process on the path summed); each lock apiserver path against each CRD path:\n\n| lock apiserver path | CPU ms |")
	for _, c := range gateCRDs {
		_, total := byName[c.variant].perWrite()
		fmt.Printf(" vs %s, %.2f ms |", c.name, 1000*total)
	}
	fmt.Printf("\n|---|---:|%s\n", strings.Repeat("---:|", len(gateCRDs)))
	for _, row := range gateRows() {
		r := byName[row.variant]
		_, total := r.perWrite()
		fmt.Printf("| %s | %.2f |", row.name, 1000*total)
		for _, c := range gateCRDs {
			fmt.Printf(" %s |", relativeTo(r, byName[c.variant]))
		}
		fmt.Println()
	}
	fmt.Println()
	leaseBy, lease := byName[leaseVariant].perWrite()
	for _, enc := range []string{"json", "cbor"} {
		r := byName[proxiedVariant(enc)]
		by, total := r.perWrite()
		for _, c := range gateCRDs {
			verdict := "met"
			if rel := relativeTo(r, byName[c.variant]); rel.all > 0.5 {
				verdict = "NOT met"
			}
			fmt.Printf("- %s in the lock etcd, through kube-apiserver, against %s: %s\n", enc, c.name, verdict)
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
