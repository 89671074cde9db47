# syntax=docker/dockerfile:1
#
# kubelock images: `docker build .` builds the operator (cmd/manager, the last
# stage); `docker build --target kubelock .` builds the CLI and sidecar (cmd/kubelock);
# `--target apiserver` the lock apiserver (cmd/kubelock-apiserver) and `--target
# etcd` its store's etcd (built from etcd's Go module at ETCD_VERSION, as
# hack/build-control-plane.sh builds the control plane's, but static).
# Neither holds kubelock-dev (cmd/kubelock-dev, the local environment of `make dev`).
# Both are one static binary (CGO_ENABLED=0) on an empty base that carries only CA
# certificates and a nonroot user, like a distroless "static:nonroot" image, and run
# as 65532:65532.

ARG GO_VERSION=1.26
ARG ETCD_VERSION=v3.7.3

# ---- build: module cache and sources, shared by both binaries ----
# The compiler runs on the build machine's platform and cross-compiles (pure Go).
FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
WORKDIR /src
ENV CGO_ENABLED=0 GOFLAGS=-trimpath
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .

FROM build AS build-manager
# ARGs are per stage: declare the target platform where it is used.
ARG TARGETOS=linux TARGETARCH
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    GOOS=${TARGETOS} GOARCH=${TARGETARCH} go build -ldflags="-s -w" -o /out/manager ./cmd/manager

FROM build AS build-kubelock
ARG TARGETOS=linux TARGETARCH
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    GOOS=${TARGETOS} GOARCH=${TARGETARCH} go build -ldflags="-s -w" -o /out/kubelock ./cmd/kubelock

FROM build AS build-apiserver
ARG TARGETOS=linux TARGETARCH
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    GOOS=${TARGETOS} GOARCH=${TARGETARCH} go build -ldflags="-s -w" -o /out/kubelock-apiserver ./cmd/kubelock-apiserver

# etcd from its Go module in a throwaway module (its own go.mod has replace
# directives, so `go install module@version` cannot build it).
FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build-etcd
ARG ETCD_VERSION TARGETOS=linux TARGETARCH
WORKDIR /etcd-build
ENV CGO_ENABLED=0 GOFLAGS=-trimpath
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    go mod init kubelock.local/etcd-build && go get go.etcd.io/etcd/server/v3@${ETCD_VERSION} \
 && GOOS=${TARGETOS} GOARCH=${TARGETARCH} go build -ldflags="-s -w" -o /out/etcd go.etcd.io/etcd/server/v3

# ---- rootfs: what a distroless static image holds, and nothing else ----
FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS rootfs
RUN mkdir -p /rootfs/etc/ssl/certs /rootfs/tmp /rootfs/home/nonroot \
 && cp /etc/ssl/certs/ca-certificates.crt /rootfs/etc/ssl/certs/ \
 && echo 'root:x:0:0:root:/root:/sbin/nologin' >/rootfs/etc/passwd \
 && echo 'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >>/rootfs/etc/passwd \
 && printf 'root:x:0:\nnonroot:x:65532:\n' >/rootfs/etc/group \
 && chmod 1777 /rootfs/tmp \
 && chown 65532:65532 /rootfs/home/nonroot

# ---- images ----
FROM scratch AS kubelock
COPY --from=rootfs /rootfs/ /
COPY --from=build-kubelock /out/kubelock /kubelock
USER 65532:65532
ENTRYPOINT ["/kubelock"]

FROM scratch AS apiserver
COPY --from=rootfs /rootfs/ /
COPY --from=build-apiserver /out/kubelock-apiserver /kubelock-apiserver
USER 65532:65532
ENTRYPOINT ["/kubelock-apiserver"]

FROM scratch AS etcd
COPY --from=rootfs /rootfs/ /
COPY --from=build-etcd /out/etcd /etcd
USER 65532:65532
ENTRYPOINT ["/etcd"]

FROM scratch AS manager
COPY --from=rootfs /rootfs/ /
COPY --from=build-manager /out/manager /manager
USER 65532:65532
ENTRYPOINT ["/manager"]
