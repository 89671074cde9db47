//go:build !linux

package proc

import "syscall"

// sysProcAttr puts a child into its own process group.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
