package stack

import "syscall"

// sysProcAttr puts each program in its own process group, so that a Ctrl-C in the terminal
// reaches only the benchmark, which then stops the programs in order; and has the kernel send
// SIGTERM to a program whose benchmark died without stopping it.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}
