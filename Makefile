# kubelock — see README.md. `make help` lists the targets.

SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec

LOCALBIN ?= $(shell pwd)/bin
CONTROLLER_TOOLS_VERSION ?= v0.23.0
GOLANGCI_LINT_VERSION ?= v2.15.0
CONTROLLER_GEN ?= $(LOCALBIN)/controller-gen-$(CONTROLLER_TOOLS_VERSION)
GOLANGCI_LINT ?= $(LOCALBIN)/golangci-lint-$(GOLANGCI_LINT_VERSION)
# helm, for the chart in dist/chart (make chart-lint, and test/chart under make test).
HELM_VERSION ?= v4.3.1
export HELM ?= $(LOCALBIN)/helm-$(HELM_VERSION)

# The control plane built from Go modules by hack/build-control-plane.sh.
K8S_VERSION ?= v1.37.2
ETCD_VERSION ?= v3.7.3
CONTROL_PLANE_DIR ?= $(LOCALBIN)/k8s/$(K8S_VERSION:v%=%)-etcd-$(ETCD_VERSION:v%=%)
export KUBEBUILDER_ASSETS ?= $(CONTROL_PLANE_DIR)

GO_TEST_FLAGS ?= -race -count=1
GO_TEST_TIMEOUT ?= 30m

# test/bench is a Go module of its own (its dependencies: gonum/plot, redsync,
# go-redis, the etcd client, pprof), so they stay out of the root go.mod and never
# reach users of pkg/lock. `./...` in the root does not include it: the targets
# that build, vet, lint or test every package run a second time in BENCH_DIR.
BENCH_DIR := test/bench

.PHONY: all
all: build

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "\nUsage:\n  make \033[36m<target>\033[0m\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) } ' $(MAKEFILE_LIST)

##@ Development

.PHONY: manifests
manifests: $(CONTROLLER_GEN) ## Generate the CRD, RBAC and webhook manifests, and the Helm chart's templates that come from config/.
	$(CONTROLLER_GEN) rbac:roleName=kubelock-manager crd webhook paths="./..." \
		output:crd:artifacts:config=config/crd/bases \
		output:rbac:artifacts:config=config/rbac \
		output:webhook:artifacts:config=config/webhook
	go run ./hack/chartgen

.PHONY: generate
generate: $(CONTROLLER_GEN) ## Generate deepcopy code, and the lock apiserver's OpenAPI definitions (server-side apply and kubectl explain read them).
	$(CONTROLLER_GEN) object:headerFile="hack/boilerplate.go.txt" paths="./..."
	go tool openapi-gen --output-dir lockapiserver/openapi --output-pkg github.com/kubelock/kubelock/lockapiserver/openapi \
		--output-file zz_generated.openapi.go --output-model-name-file zz_generated.model_name.go \
		--readonly-pkg k8s.io/apimachinery/pkg/apis/meta/v1 --readonly-pkg k8s.io/apimachinery/pkg/runtime --readonly-pkg k8s.io/apimachinery/pkg/version \
		--go-header-file hack/boilerplate.go.txt --report-filename /dev/null \
		github.com/kubelock/kubelock/api/v1alpha1 k8s.io/apimachinery/pkg/apis/meta/v1 k8s.io/apimachinery/pkg/runtime k8s.io/apimachinery/pkg/version

.PHONY: fmt
fmt: ## Run go fmt (both modules: the root and test/bench).
	go fmt ./...
	go -C $(BENCH_DIR) fmt ./...

.PHONY: vet
vet: ## Run go vet (both modules).
	go vet ./...
	go -C $(BENCH_DIR) vet ./...

.PHONY: lint-fix
lint-fix: $(GOLANGCI_LINT) ## Run golangci-lint and apply the fixes it knows (both modules).
	$(GOLANGCI_LINT) run --fix --allow-serial-runners ./...
	$(GOLANGCI_LINT) run --fix --allow-serial-runners --build-tags faults ./cmd/manager/operator/... ./test/e2e/faults/...
	$(GOLANGCI_LINT) run --fix --allow-serial-runners --build-tags cluster ./test/e2e/cluster/...
	cd $(BENCH_DIR) && $(GOLANGCI_LINT) run --fix --allow-serial-runners --config $(CURDIR)/.golangci.yml ./...

.PHONY: lint
lint: $(GOLANGCI_LINT) $(HELM) ## Run golangci-lint (both modules, with the root's .golangci.yml; the faults and cluster builds too) and helm lint on dist/chart.
	$(HELM) lint --strict dist/chart
	$(GOLANGCI_LINT) run --allow-serial-runners ./...
	$(GOLANGCI_LINT) run --allow-serial-runners --build-tags faults ./cmd/manager/operator/... ./test/e2e/faults/...
	$(GOLANGCI_LINT) run --allow-serial-runners --build-tags cluster ./test/e2e/cluster/...
	cd $(BENCH_DIR) && $(GOLANGCI_LINT) run --allow-serial-runners --config $(CURDIR)/.golangci.yml ./...

.PHONY: verify
verify: manifests generate ## Regenerate code, manifests and the chart's templates from config/; fail on any diff or untracked generated file, untidy go.mod, a benchmark-only dependency in pkg/lock, or a merge's conflict markers.
	@hack/verify-clean.sh api config dist lockapiserver/openapi
	@hack/verify-modules.sh
	@hack/verify-no-conflicts.sh

CONTROL_PLANE_BINS := $(addprefix $(CONTROL_PLANE_DIR)/,etcd kube-apiserver kube-controller-manager kubectl)

.PHONY: control-plane
control-plane: $(CONTROL_PLANE_BINS) ## Build etcd, kube-apiserver, kube-controller-manager and kubectl from Go modules into ./bin.

# Grouped (&:): one script run makes all four.
$(CONTROL_PLANE_BINS) &: hack/build-control-plane.sh hack/lib/build.sh
	K8S_VERSION=$(K8S_VERSION) ETCD_VERSION=$(ETCD_VERSION) CONTROL_PLANE_DIR=$(CONTROL_PLANE_DIR) hack/build-control-plane.sh
	@touch $(CONTROL_PLANE_BINS)

# A real node next to the control plane (hack/build-node.sh): kubelet,
# kube-scheduler and kube-proxy into CONTROL_PLANE_DIR; containerd v2, runc
# (seccomp, static; needs Debian's libseccomp-dev) and the CNI plugins into NODE_DIR.
NODE_DIR ?= $(LOCALBIN)/node
NODE_BINS := $(addprefix $(CONTROL_PLANE_DIR)/,kubelet kube-scheduler kube-proxy) \
	$(addprefix $(NODE_DIR)/,containerd containerd-shim-runc-v2 ctr runc cni/bridge cni/host-local cni/loopback cni/portmap etcd)

.PHONY: node
node: $(NODE_BINS) ## Build what `make dev NODE=1` adds: kubelet, kube-scheduler, kube-proxy, containerd, runc and the CNI plugins, from Go modules into ./bin.

$(NODE_BINS) &: hack/build-node.sh hack/lib/build.sh
	@# Debian's packages the node needs: the static libseccomp for runc, iptables and conntrack for kube-proxy.
	@{ [ -e /usr/lib/x86_64-linux-gnu/libseccomp.a ] && command -v iptables && command -v conntrack; } >/dev/null || [ "$$(id -u)" != 0 ] || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libseccomp-dev iptables conntrack; }
	K8S_VERSION=$(K8S_VERSION) ETCD_VERSION=$(ETCD_VERSION) CONTROL_PLANE_DIR=$(CONTROL_PLANE_DIR) NODE_DIR=$(NODE_DIR) hack/build-node.sh
	@touch $(NODE_BINS)

.PHONY: test-deps
test-deps: ## Install what the tests need and the machine lacks, from Debian's packages: the PostgreSQL server; HAProxy (the HA control plane's balancer); Node.js, npm and Python 3 (the agent's Dapr SDK and Python example tests).
	hack/install-postgres.sh
	hack/install-haproxy.sh
	hack/install-runtimes.sh

# The suites by kind. Unit: every package outside the suites below (pure rules,
# the library, the CLI; the controller's and the API's own envtest suites too).
INTEGRATION_PKGS := ./test/admission/... ./test/chart/... ./test/gc/... ./test/integration/... ./test/leaderelection/... ./test/observability/...
E2E_PKGS := ./test/e2e/...
UNIT_PKGS = $(shell go list ./... | grep -v -e '/test/admission' -e '/test/chart' -e '/test/gc' -e '/test/integration' -e '/test/leaderelection' -e '/test/observability' -e '/test/e2e')

# The release the upgrade suite (test/e2e/upgrade) upgrades from: main as it
# landed before the reliability work began, built from this clone's history.
PREVIOUS_RELEASE ?= ff609ba
PREVIOUS_RELEASE_DIR ?= $(LOCALBIN)/releases/$(PREVIOUS_RELEASE)
# Not KUBELOCK_-prefixed: the CLI suites check that kubelock run passes its
# command exactly the KUBELOCK_ variables of its holdings.
export UPGRADE_FROM_BUILD := $(PREVIOUS_RELEASE_DIR)

.PHONY: previous-release
previous-release: ## Build the manager and the kubelock CLI of PREVIOUS_RELEASE (a commit of this clone's history), with its CRDs and webhook configuration, into bin/releases: the upgrade suite starts from them.
	hack/build-previous-release.sh $(PREVIOUS_RELEASE) $(PREVIOUS_RELEASE_DIR)

.PHONY: test
test: manifests generate control-plane test-deps previous-release $(HELM) ## Run all tests against a real kube-apiserver and etcd: what test-unit, test-integration and test-e2e run, the benchmark module's, and (as root) the real-node suite.
	go test $(GO_TEST_FLAGS) -timeout $(GO_TEST_TIMEOUT) ./...
	go -C $(BENCH_DIR) test $(GO_TEST_FLAGS) -timeout $(GO_TEST_TIMEOUT) ./...
	@# The real-node suite needs root; without it, say plainly that it did not run.
	@if [ "$$(id -u)" = 0 ]; then $(MAKE) test-cluster; else echo "make test: the real-node suite (make test-cluster) needs root: NOT RUN"; fi

.PHONY: test-unit
test-unit: manifests generate control-plane test-deps ## Run the packages outside test/'s suites.
	go test $(GO_TEST_FLAGS) -timeout $(GO_TEST_TIMEOUT) $(UNIT_PKGS)

.PHONY: test-integration
test-integration: manifests generate control-plane test-deps $(HELM) ## Run the admission, chart, garbage-collection, protocol, leader-election and observability suites against the real control plane.
	go test $(GO_TEST_FLAGS) -timeout $(GO_TEST_TIMEOUT) $(INTEGRATION_PKGS)

.PHONY: test-e2e
test-e2e: manifests generate control-plane test-deps previous-release ## Run the end-to-end suites (the upgrade from the previous release, the CLI, the agent through Dapr's JavaScript SDK and the Python example, and kubelock-dev as processes).
	go test $(GO_TEST_FLAGS) -timeout $(GO_TEST_TIMEOUT) $(E2E_PKGS)

# The real-node suite (test/e2e/cluster, build tag cluster): kubelock-dev --node,
# the operator Deployment, failover, the webhook through its Service, the sidecar
# and agent samples as pods, the chart electing on kubelock (helm upgrade); once
# on each backend (CLUSTER_BACKEND=apiserver: the chart's kubelock-apiserver and
# its etcd as pods, a replica deleted under load). Root only: `make test` runs it
# as root and says NOT RUN otherwise.
.PHONY: test-cluster
test-cluster: manifests generate control-plane node $(HELM) ## Run the real-node suite as root (kubelet, containerd, kube-proxy; the operator and the samples as pods).
	@[ "$$(id -u)" = 0 ] || { echo "make test-cluster needs root (kubelet, containerd, iptables): not run"; exit 1; }
	go test -tags cluster -count=1 -timeout 30m -v ./test/e2e/cluster/
	CLUSTER_BACKEND=apiserver go test -tags cluster -count=1 -timeout 30m -v ./test/e2e/cluster/

##@ Run

# Flags for kubelock-dev, e.g. DEV_FLAGS="--persist --apiserver-port 6443".
DEV_FLAGS ?=
# NODE=1: a real node (root): kubelet, containerd, kube-proxy, the operator as a Deployment.
NODE ?=
# ADMISSION=policy: the lock rules as config/policy's ValidatingAdmissionPolicies
# instead of the operator's webhook (kubelock-dev --admission; default webhook).
ADMISSION ?=
# BACKEND=apiserver: the lock API from kubelock-apiserver and an etcd of its own,
# behind an APIService, instead of the CRDs (kubelock-dev --backend; default crd):
# processes, or with NODE=1 the chart's pods.
BACKEND ?=

.PHONY: dev
dev: control-plane install-plugin kubelock-dev $(if $(NODE),node) $(if $(filter apiserver,$(BACKEND)),$(if $(NODE),$(HELM),kubelock-apiserver)) ## Run kubelock locally (bin/kubelock-dev: etcd, kube-apiserver, kube-controller-manager, CRD, operator) until Ctrl-C; prints the next steps. NODE=1 adds a real node (root); ADMISSION=policy enforces the rules with config/policy instead of the webhook; BACKEND=apiserver serves the lock API from kubelock-apiserver (with NODE=1, the chart's pods).
	$(LOCALBIN)/kubelock-dev $(if $(NODE),--node --node-dir $(NODE_DIR)) $(if $(ADMISSION),--admission $(ADMISSION)) $(if $(BACKEND),--backend $(BACKEND)) $(DEV_FLAGS)

##@ Deploy

# The operator image config/default deploys, and the kubectl that applies it
# (the control plane's, or set KUBECTL=kubectl for your own).
IMG ?= controller:latest
KUBECTL ?= $(CONTROL_PLANE_DIR)/kubectl

.PHONY: deploy
deploy: ## Deploy the operator (config/default, image IMG) to the cluster of the current kubeconfig.
	$(KUBECTL) kustomize config/default | sed 's|image: controller:latest|image: $(IMG)|' | $(KUBECTL) apply -f -

.PHONY: undeploy
undeploy: ## Remove what `make deploy` created (the CRD too, and with it every DistributedLock).
	$(KUBECTL) delete -k config/default --ignore-not-found

##@ Build

.PHONY: build
build: ## Build the manager, the kubelock CLI, kubelock-dev and kubelock-apiserver into ./bin.
	go build -o $(LOCALBIN)/manager ./cmd/manager
	go build -o $(LOCALBIN)/kubelock-apiserver ./cmd/kubelock-apiserver
	go build -o $(LOCALBIN)/kubelock ./cmd/kubelock
	go build -o $(LOCALBIN)/kubelock-dev ./cmd/kubelock-dev

# The images of the Dockerfile's targets; needs a Docker engine. The chart's
# backend: apiserver runs the last two.
IMG_KUBELOCK ?= kubelock:latest
IMG_APISERVER ?= kubelock/apiserver:latest
IMG_ETCD ?= kubelock/etcd:latest

.PHONY: docker-build
docker-build: ## Build the operator image (IMG), the CLI/sidecar image (IMG_KUBELOCK), the lock apiserver's (IMG_APISERVER) and its etcd's (IMG_ETCD) with Docker.
	docker build --target manager -t $(IMG) .
	docker build --target kubelock -t $(IMG_KUBELOCK) .
	docker build --target apiserver -t $(IMG_APISERVER) .
	docker build --target etcd --build-arg ETCD_VERSION=$(ETCD_VERSION) -t $(IMG_ETCD) .

##@ Tools

$(LOCALBIN):
	mkdir -p $(LOCALBIN)

$(CONTROLLER_GEN): | $(LOCALBIN)
	GOBIN=$(LOCALBIN) go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_TOOLS_VERSION)
	mv -f $(LOCALBIN)/controller-gen $@

$(GOLANGCI_LINT): | $(LOCALBIN)
	GOBIN=$(LOCALBIN) go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv -f $(LOCALBIN)/golangci-lint $@

.PHONY: helm
helm: $(HELM) ## Build helm (HELM_VERSION) from Go modules into ./bin.

HELM_MODULE = helm.sh/helm/$(word 1,$(subst ., ,$(HELM_VERSION)))
$(HELM): | $(LOCALBIN)
	@# The version helm reports (and charts' kubeVersion checks see), as its own Makefile sets it.
	GOBIN=$(LOCALBIN) go install -ldflags "-X $(HELM_MODULE)/internal/version.version=$(HELM_VERSION)" $(HELM_MODULE)/cmd/helm@$(HELM_VERSION)
	mv -f $(LOCALBIN)/helm $@

##@ CLI

# Where install-plugin puts the kubectl-lock symlink; put it on PATH.
PLUGIN_DIR ?= $(LOCALBIN)

.PHONY: kubelock
kubelock: | $(LOCALBIN) ## Build the kubelock CLI (kubectl plugin, run wrapper, sidecar) into ./bin.
	go build -o $(LOCALBIN)/kubelock ./cmd/kubelock

.PHONY: kubelock-dev
kubelock-dev: | $(LOCALBIN) ## Build kubelock-dev (the local environment `make dev` runs; operator code, kept out of kubelock) into ./bin.
	go build -o $(LOCALBIN)/kubelock-dev ./cmd/kubelock-dev

.PHONY: kubelock-apiserver
kubelock-apiserver: | $(LOCALBIN) ## Build kubelock-apiserver (the lock API from an etcd of its own, behind an APIService) into ./bin.
	go build -o $(LOCALBIN)/kubelock-apiserver ./cmd/kubelock-apiserver

.PHONY: install-plugin
install-plugin: kubelock ## Install kubelock as the kubectl plugin kubectl-lock in PLUGIN_DIR (default ./bin), so `kubectl lock ...` works.
	mkdir -p $(PLUGIN_DIR)
	ln -sf $(LOCALBIN)/kubelock $(PLUGIN_DIR)/kubectl-lock
	@echo "installed $(PLUGIN_DIR)/kubectl-lock; with $(PLUGIN_DIR) on PATH, run: kubectl lock --help"

##@ Release

# The kubectl-lock release (hack/release.sh): VERSION defaults to `git describe`.
RELEASE_DIR ?= $(CURDIR)/release
KREW_VERSION ?= v0.4.3
KREW ?= $(LOCALBIN)/krew-$(KREW_VERSION)
VALIDATE_KREW_MANIFEST ?= $(LOCALBIN)/validate-krew-manifest-$(KREW_VERSION)

.PHONY: release
release: ## Build the kubectl-lock archives (linux, darwin; amd64, arm64), their sha256 sums and the krew plugin manifest into RELEASE_DIR.
	RELEASE_DIR=$(RELEASE_DIR) hack/release.sh

.PHONY: test-release
test-release: release $(KREW) $(VALIDATE_KREW_MANIFEST) $(CONTROL_PLANE_DIR)/kubectl ## Validate the krew manifest with krew's validator, install each archive with `kubectl krew install --manifest --archive` and run `kubectl lock --help` through it.
	RELEASE_DIR=$(RELEASE_DIR) KREW=$(KREW) VALIDATE_KREW_MANIFEST=$(VALIDATE_KREW_MANIFEST) KUBECTL=$(CONTROL_PLANE_DIR)/kubectl hack/test-krew.sh

# krew and its manifest validator, from krew's Go module.
$(KREW): | $(LOCALBIN)
	GOBIN=$(LOCALBIN) go install sigs.k8s.io/krew/cmd/krew@$(KREW_VERSION)
	mv -f $(LOCALBIN)/krew $@

$(VALIDATE_KREW_MANIFEST): | $(LOCALBIN)
	GOBIN=$(LOCALBIN) go install sigs.k8s.io/krew/cmd/validate-krew-manifest@$(KREW_VERSION)
	mv -f $(LOCALBIN)/validate-krew-manifest $@

##@ Fault injection

# How long the fault-injection soak runs; CI runs `make test-faults FAULTS_SOAK=2m`.
FAULTS_SOAK ?= 10m
# Seed of the soak's workload and fault schedule; empty means the clock (the run prints it).
FAULTS_SEED ?=

.PHONY: test-faults
test-faults: manifests generate control-plane ## Run the fault-injection suite (test/e2e/faults): 3 etcd members, 2 managers, client processes, faults, history checks, soak; the HA control plane's scenarios (2 apiservers behind HAProxy); then the seed's acceptance test on one apiserver and on the lock apiserver backend.
	hack/install-postgres.sh
	hack/install-haproxy.sh
	go test -tags faults -race -count=1 -run "TestShiftWall|TestWallOffsetClock" ./cmd/manager/operator/
	FAULTS_SOAK=$(FAULTS_SOAK) FAULTS_SEED=$(FAULTS_SEED) go test -tags faults -race -count=1 -timeout 90m ./test/e2e/faults/ -v -ginkgo.v -ginkgo.label-filter '!seed-acceptance'
	FAULTS_SEED_BOUND=report $(SEED_TEST) -ginkgo.label-filter 'seed-acceptance && !ha-plane'

# The seed's acceptance test times an uncontended acquire (p99 ≤ 200 ms) at 70 %
# of the rate the seed mix sustains on this machine with and without the
# fault's replicas (probed in the same run), before, during and after one etcd
# member stopped with compaction and defragmentation running, on one apiserver,
# on the HA plane (label ha-plane) and on the lock apiserver backend (label
# lock-apiserver: its lock store's member). It runs in a `go test` of its own,
# without the race detector, which would time the detector rather than the
# locks. test-faults (and so CI) runs the one-apiserver and lock apiserver
# specs (~8 and ~11 min) and asserts their history checks, no failed operation
# and no lost holding, but only reports the latency bound
# (FAULTS_SEED_BOUND=report): on two shared cores the same tree met it and
# missed it from run to run. test-seed asserts
# the bound too, on a quiet machine; its HA plane's spec stays here, since two
# apiservers beside the suite's own control plane leave a p99 near the bound
# at any rate on two cores (docs/reliability.md).
SEED_TEST = go test -tags faults -count=1 -timeout 60m ./test/e2e/faults/ -v -ginkgo.v

.PHONY: test-seed
test-seed: manifests generate control-plane ## Run the seed's acceptance test alone, on one apiserver, on the HA plane and on the lock apiserver backend (test/e2e/faults, label seed-acceptance); prints its latency tables.
	hack/install-postgres.sh
	hack/install-haproxy.sh
	$(SEED_TEST) -ginkgo.label-filter seed-acceptance

##@ Benchmarks

# Extra flags for test/bench, e.g. BENCH_FLAGS="--rate-scale 0.5 --systems webhook,lease".
BENCH_FLAGS ?=

.PHONY: bench
bench: control-plane ## Benchmark kubelock (its CRD's admission engines and the lock apiserver backend) against raw Leases, leader election, etcd and redsync, and the operator at 100,000 locks (~20 min on 2 cores); writes docs/benchmarks.md and plots.
	hack/install-redis.sh
	go -C $(BENCH_DIR) run . $(BENCH_FLAGS)

.PHONY: bench-quick
bench-quick: control-plane ## The benchmark's smoke-test preset (< 6 min); figures reported, nothing asserted.
	hack/install-redis.sh
	go -C $(BENCH_DIR) run . --quick $(BENCH_FLAGS)

# The lock apiserver's scale model: the seed mix on 1, 2 and 3 replicas of
# kubelock-apiserver, each held to 0.4 core by a cgroup v1 of its own (needs
# root; reported as not run otherwise), next to raw Lease CAS and the backend
# through kube-apiserver (~12 min).
.PHONY: bench-scale-model
bench-scale-model: control-plane ## Run the lock apiserver's scale model (1, 2, 3 replicas under equal CPU quotas) with raw Lease CAS and the apiserver backend's seed mix; writes /tmp/kubelock-bench-scale-model/report.md.
	hack/install-redis.sh
	go -C $(BENCH_DIR) run . --scale-model --locks 20000 --systems lease,apiserver --workloads 1 --out /tmp/kubelock-bench-scale-model/report.md $(BENCH_FLAGS)

# CBOR is alpha in kube-apiserver 1.37 (CBORServingAndStorage, off by default),
# so kubelock's clients speak JSON and make bench measures JSON; this target runs
# JSON and CBOR clients side by side on an apiserver with the gate on, with the
# default step lengths (the comparison needs them) on 20,000 locks (~10 min).
.PHONY: bench-encoding
bench-encoding: control-plane ## Compare pkg/lock over JSON and over CBOR in one run (webhook, policy, raw Lease; workloads 1, 2, 5); writes /tmp/kubelock-bench-encoding/report.md.
	hack/install-redis.sh
	go -C $(BENCH_DIR) run . --locks 20000 --encoding json,cbor --systems webhook,policy,lease --workloads 1,2,5 --out /tmp/kubelock-bench-encoding/report.md $(BENCH_FLAGS)
