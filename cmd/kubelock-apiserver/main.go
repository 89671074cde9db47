// Command kubelock-apiserver serves the kubelock API from an etcd of its own,
// registered with kube-apiserver by an APIService (docs/design.md, "Backends").
package main

import (
	"os"

	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/component-base/cli"

	"github.com/kubelock/kubelock/lockapiserver"
)

func main() {
	os.Exit(cli.Run(lockapiserver.NewCommand(genericapiserver.SetupSignalContext())))
}
