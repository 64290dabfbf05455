//go:build !linux

package stack

import "syscall"

// sysProcAttr puts each program in its own process group, so that a Ctrl-C in the terminal
// reaches only the benchmark, which then stops the programs in order.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
