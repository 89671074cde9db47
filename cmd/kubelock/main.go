// Command kubelock is the kubelock CLI, kubectl plugin (`kubectl lock …` when
// installed as kubectl-lock), `run -- CMD` wrapper and sidecar. Run it with
// --help for its commands and exit codes.
package main

import (
	"os"

	"github.com/kubelock/kubelock/cmd/kubelock/cli"
)

func main() { os.Exit(cli.Main(os.Args)) }
