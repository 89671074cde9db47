// Command manager is the kubelock operator. Run it with --help for its flags.
package main

import "github.com/kubelock/kubelock/cmd/manager/operator"

func main() { operator.Exit() }
