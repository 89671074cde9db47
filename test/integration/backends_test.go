package integration

import (
	"context"
	"slices"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/kubelock/kubelock/test/lockapi"
	"github.com/kubelock/kubelock/test/suite"
	"github.com/kubelock/kubelock/test/testenv"
)

// The lock API is served by a backend (docs/design.md, "Backends"): the CRD
// in kube-apiserver, its rules in the admission webhook this process serves;
// or kubelock-apiserver behind an APIService, its rules in-process. Clients
// and the controller must not tell them apart, so every top-level container
// of this package is declared once, with backends.Describe, and built inside
// each backend's container, whose BeforeAll starts that backend's control
// plane and the controller. A container that only makes sense on one backend
// carries that backend's label and is built there alone: on the other its
// specs are neither run nor counted.
var backends = &matrix{backends: []backend{
	{name: "crd", start: func(context.Context) *lockEnv {
		return &lockEnv{Env: suite.Start(controllerUser)}
	}},
	{name: "apiserver", start: func(ctx context.Context) *lockEnv {
		api := suite.BuildLockAPI(ctx)
		env, srv := suite.StartLockAPI(ctx, api)
		return &lockEnv{Env: env, server: srv, api: api}
	}},
}}

// controllerUser is the controller's user on both backends: the lock
// apiserver knows it as its controller from its start.
const controllerUser = lockapi.ControllerUser

// A backend serves the lock API.
type backend struct {
	// name is what the backend is called (the chart's backend value); its
	// label is backendLabel(name).
	name string
	// start starts, for a BeforeAll, a control plane serving the lock API
	// this way with the webhook server of this process, and sets suite.Env;
	// DeferCleanup stops them.
	start func(context.Context) *lockEnv
}

// backendLabel is the label of a backend's specs: -ginkgo.label-filter=
// backend:apiserver runs them alone.
func backendLabel(name string) string { return "backend:" + name }

// lockEnv is a control plane whose lock API one backend serves.
type lockEnv struct {
	*testenv.Env
	// server serves the lock API on the apiserver backend; nil on the CRD
	// backend, where kube-apiserver does.
	server *lockapi.Server
	// api is the lock apiserver's binary, on the apiserver backend.
	api *suite.LockAPI
}

// RewriteStored changes an object as the backend stores it, behind the back
// of the server that serves it (testenv.Env.RewriteStored).
func (e *lockEnv) RewriteStored(ctx context.Context, gr schema.GroupResource, key k8stypes.NamespacedName, change func(obj map[string]any)) error {
	if e.server != nil {
		return e.server.RewriteStored(ctx, gr, key, change)
	}
	return e.Env.RewriteStored(ctx, gr, key, change)
}

// LockAPIConfig is an administrator's connection to the server that serves
// the lock API: kube-apiserver, or the lock apiserver itself, whose metrics
// count the lock API's requests (kube-apiserver only proxies them).
func (e *lockEnv) LockAPIConfig() *rest.Config {
	if e.server != nil {
		return e.server.Direct(e.Config)
	}
	return e.Config
}

// another starts another control plane on e's backend, with no webhook
// and no controller, whose etcd runs with the flags of etcdArgs (name,
// value, ...): on the apiserver backend, both kube-apiserver's and the lock
// store's. DeferCleanup stops it.
func (e *lockEnv) another(ctx context.Context, etcdArgs ...string) *lockEnv {
	withEtcdArgs := testenv.WithEtcdArgs(etcdArgs...)
	if e.api == nil {
		env, err := testenv.Start(withEtcdArgs)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(env.Stop()).To(Succeed()) })
		return &lockEnv{Env: env}
	}
	env, err := lockapi.ControlPlane(withEtcdArgs)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() { Expect(env.Stop()).To(Succeed()) })
	var flags []string
	for i := 0; i+1 < len(etcdArgs); i += 2 {
		flags = append(flags, "--"+etcdArgs[i]+"="+etcdArgs[i+1])
	}
	return &lockEnv{Env: env, server: e.api.Serve(ctx, env, lockapi.Options{EtcdArgs: flags}), api: e.api}
}

// matrix is the package's top-level containers and the backends each runs on.
type matrix struct {
	backends   []backend
	containers []container
}

type container struct {
	// declare declares it with Ginkgo, where it was written.
	declare func()
	// labels are the labels it was declared with.
	labels Labels
}

// runsOn says whether c is built on b: on every backend unless it carries
// backend labels, then on those.
func (c container) runsOn(b backend) bool {
	own := slices.ContainsFunc(c.labels, func(l string) bool { return strings.HasPrefix(l, backendLabel("")) })
	return !own || slices.Contains(c.labels, backendLabel(b.name))
}

// Describe declares a top-level container as Ginkgo's Describe does, to be
// built on the backends it runs on; it returns true for `var _ =`.
func (m *matrix) Describe(text string, args ...any) bool {
	args = append(args, types.NewCodeLocation(1)) // where it was written, not here
	c := container{declare: func() { Describe(text, args...) }}
	for _, a := range args {
		if l, ok := a.(Labels); ok {
			c.labels = append(c.labels, l...)
		}
	}
	m.containers = append(m.containers, c)
	return true
}

// build declares a container per backend holding the containers that run on
// it, once all are declared (from TestIntegration, before RunSpecs). Its
// BeforeAll, which needs it Ordered, starts the backend once for them;
// some of them are Serial, which Ginkgo allows in an Ordered container that
// is Serial itself; and a failed spec lets the rest run.
func (m *matrix) build() {
	for _, b := range m.backends {
		Describe("on the "+b.name+" backend", Label(backendLabel(b.name)), Ordered, Serial, ContinueOnFailure, func() {
			BeforeAll(func(ctx SpecContext) {
				env = b.start(ctx)
				startController()
				DeferCleanup(func() { stopController() })
			})
			for _, c := range m.containers {
				if c.runsOn(b) {
					c.declare()
				}
			}
		})
	}
}
