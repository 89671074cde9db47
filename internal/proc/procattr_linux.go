package proc

import "syscall"

// sysProcAttr puts a child into its own process group and has the kernel kill
// it if kubelock-dev dies without stopping it (SIGKILL, a crash).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
