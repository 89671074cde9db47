package devenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/kubelock/kubelock/internal/localcluster/node"
)

// With --node the operator runs on a real node (package node), deployed from
// config/default with images built from the checkout.
const (
	// ManagerImage and KubelockImage are the images config/default and the
	// samples name; they are imported, never pulled (imagePullPolicy: Never,
	// or IfNotPresent in the samples), as are the samples' app images.
	ManagerImage  = "kubelock/manager:latest"
	KubelockImage = "kubelock:latest"
	// APIServerImage and EtcdImage are the chart's for backend=apiserver.
	APIServerImage  = "kubelock/apiserver:latest"
	EtcdImage       = "kubelock/etcd:latest"
	appImage        = "orders-writer:latest"
	migrationsImage = "orders-migrations:latest"
	workerImage     = "invoice-worker:latest"
	// OperatorNamespace and OperatorDeployment are config/default's;
	// APIServerDeployment is the chart's kubelock-apiserver.
	OperatorNamespace   = "kubelock-system"
	OperatorDeployment  = "kubelock-controller-manager"
	APIServerDeployment = "kubelock-apiserver"
	// operatorServiceAccount is config/default's account of the operator's pods.
	operatorServiceAccount = "kubelock-controller-manager"
)

// images are what the node imports: the operator, kubelock and the samples' apps.
var images = []node.Image{
	{Ref: ManagerImage, Packages: []string{"./cmd/manager"}},
	{Ref: KubelockImage, Packages: []string{"./cmd/kubelock"}},
	{Ref: appImage, Packages: []string{"./config/samples/app"}},
	{Ref: migrationsImage, Packages: []string{"./config/samples/app", "./cmd/kubelock"}},
	{Ref: workerImage, Packages: []string{"./config/samples/worker"}},
}

// nodeImages are images, and with the apiserver backend kubelock-apiserver's
// and its etcd's (the static etcd `make node` builds into NodeDir).
func (e *env) nodeImages() []node.Image {
	if e.o.Backend != BackendAPIServer {
		return images
	}
	return append(slices.Clone(images),
		node.Image{Ref: APIServerImage, Packages: []string{"./cmd/kubelock-apiserver"}},
		node.Image{Ref: EtcdImage, Binaries: []string{filepath.Join(e.o.NodeDir, "etcd")}})
}

// checkNode fails early, in one line, when the node cannot run here (see
// node.New) or the checkout its images are built from is not found.
func (e *env) checkNode() error {
	o := &e.o
	root, rootErr := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/kubelock/kubelock").Output()
	e.root = strings.TrimSpace(string(root))
	dir, err := filepath.Abs(filepath.Join(o.Dir, "node"))
	if err != nil {
		return err
	}
	assets, err := filepath.Abs(o.AssetsDir)
	if err != nil {
		return err
	}
	e.node, err = node.New(node.Options{Dir: dir, BinDir: o.NodeDir, AssetsDir: assets, Module: e.root,
		Images: e.nodeImages(), StartTimeout: o.StartTimeout, Progress: e.progress})
	if err != nil {
		return err
	}
	if rootErr != nil {
		return errors.New("--node builds its images from the checkout: run kubelock-dev from the repository (with go on PATH)")
	}
	if o.Backend == BackendAPIServer {
		return e.checkChart()
	}
	return nil
}

// startNode starts the node and deploys the operator onto it.
func (e *env) startNode(ctx context.Context) error {
	ctrl.SetLogger(zap.New(zap.WriteTo(io.Discard))) // this process runs clients only
	if err := e.node.Start(ctx, e.cluster); err != nil {
		return err
	}
	if e.o.Backend == BackendAPIServer {
		return e.deployChart(ctx)
	}
	return e.deployOperator(ctx)
}

// deployOperator applies config/default (the CRDs, RBAC, the Deployment of 2
// replicas with leader election, the webhook behind its Service) and
// config/fenced-objects, with the imported image and imagePullPolicy Never,
// and returns once the Deployment is available and the apiserver enforces
// the lock rules and the fenced-objects webhook through the Service. With the
// policy engine, as the chart's admission.engine=policy: config/policy's
// policies instead of the lock webhook, and the operator's webhook serves
// fenced objects only.
func (e *env) deployOperator(ctx context.Context) error {
	started := time.Now()
	c, err := e.client()
	if err != nil {
		return err
	}
	policy := e.o.Admission == AdmissionPolicy
	for _, k := range []string{"config/default", "config/fenced-objects"} {
		out, err := exec.CommandContext(ctx, filepath.Join(e.o.AssetsDir, "kubectl"), "kustomize", filepath.Join(e.root, k)).Output()
		if err != nil {
			return fmt.Errorf("kubectl kustomize %s: %w", k, err)
		}
		objs, err := decodeObjects(out)
		if err != nil {
			return fmt.Errorf("reading %s: %w", k, err)
		}
		for _, o := range objs {
			if policy && o.GetKind() == "ValidatingWebhookConfiguration" && o.GetName() == WebhookConfigName {
				continue
			}
			if o.GetKind() == "Deployment" {
				if err := neverPull(o); err != nil {
					return err
				}
				if policy {
					if err := fencedWebhookOnly(o); err != nil {
						return err
					}
				}
			}
			if err := apply(ctx, c, o); err != nil {
				return fmt.Errorf("applying %s %s: %w", o.GetKind(), o.GetName(), err)
			}
		}
	}
	if err := e.waitAvailable(ctx, c, OperatorDeployment); err != nil {
		return err
	}
	e.progress("operator Deployment %s/%s available after %s (the node's first pods)", OperatorNamespace, OperatorDeployment, time.Since(started).Round(10*time.Millisecond))
	service := fmt.Sprintf("Service %s/kubelock-webhook-service", OperatorNamespace)
	if policy {
		err = e.registerPolicy(ctx, c, "system:serviceaccount:"+OperatorNamespace+":"+operatorServiceAccount)
	} else {
		err = e.waitAdmission(ctx, c, webhookDenial, "the admission webhook behind "+service)
	}
	if err != nil {
		return err
	}
	if err := e.waitFencedWebhook(ctx, c, service); err != nil {
		return err
	}
	return bindConfigMapWriters(ctx, c)
}

// waitAvailable returns once the Deployment name in OperatorNamespace has all
// its replicas updated and available.
func (e *env) waitAvailable(ctx context.Context, c client.Client, name string) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*e.o.StartTimeout, true, func(ctx context.Context) (bool, error) {
		d := &appsv1.Deployment{}
		if last = c.Get(ctx, client.ObjectKey{Namespace: OperatorNamespace, Name: name}, d); last == nil {
			if s, want := d.Status, *d.Spec.Replicas; s.AvailableReplicas != want || s.UpdatedReplicas != want {
				last = fmt.Errorf("%d of %d replicas available", s.AvailableReplicas, want)
			}
		}
		return last == nil, nil
	})
	if err != nil {
		return fmt.Errorf("the Deployment %s/%s: %w (kubectl -n %s describe pods; logs in %s)", OperatorNamespace, name, errors.Join(err, last), OperatorNamespace, e.logDir)
	}
	return nil
}

// fencedWebhookOnly points the manager's certificate rotation at the
// fenced-objects webhook configuration, the only one there is with the
// policy engine, as the chart's Deployment does for admission.engine=policy.
func fencedWebhookOnly(d *unstructured.Unstructured) error {
	path := []string{"spec", "template", "spec", "containers"}
	cs, _, err := unstructured.NestedSlice(d.Object, path...)
	if err != nil {
		return err
	}
	for _, c := range cs {
		m, ok := c.(map[string]any)
		if !ok || m["name"] != "manager" {
			continue
		}
		args, _ := m["args"].([]any)
		for i, a := range args {
			if s, _ := a.(string); strings.HasPrefix(s, "--webhook-config-name=") {
				args[i] = "--webhook-config-name=" + FencedWebhookConfigName
			}
		}
		m["args"] = append(args, "--fenced-webhook-config-name=")
	}
	return unstructured.SetNestedSlice(d.Object, cs, path...)
}

// neverPull sets every container of a Deployment to imagePullPolicy Never:
// its images were imported.
func neverPull(d *unstructured.Unstructured) error {
	for _, field := range []string{"containers", "initContainers"} {
		path := []string{"spec", "template", "spec", field}
		cs, found, err := unstructured.NestedSlice(d.Object, path...)
		if err != nil || !found {
			continue
		}
		for _, c := range cs {
			if m, ok := c.(map[string]any); ok {
				m["imagePullPolicy"] = string(corev1.PullNever)
			}
		}
		if err := unstructured.SetNestedSlice(d.Object, cs, path...); err != nil {
			return err
		}
	}
	return nil
}
