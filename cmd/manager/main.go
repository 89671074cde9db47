// Command manager is the kubelock operator. Run it with --help for its flags.
package main

import "github.com/kubelock/kubelock/internal/manager"

func main() { manager.Exit() }
