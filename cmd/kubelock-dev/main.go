// Command kubelock-dev runs a local kubelock (etcd, kube-apiserver, the CRD
// and the operator) until Ctrl-C; `make dev` builds and runs it. It is apart
// from the kubelock CLI so that the CLI links no operator code.
package main

import (
	"os"

	"github.com/kubelock/kubelock/cmd/kubelock-dev/devenv"
)

func main() { os.Exit(devenv.Main(os.Args, os.Stdout, os.Stderr)) }
