// Command pause is the pod sandbox process of kubelock-dev --node's images: it
// holds the pod's namespaces, reaps the orphans handed to it (it is PID 1 in
// the pod) and exits on SIGINT or SIGTERM. Built static, it is the whole image.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			return
		}
		for {
			if pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
