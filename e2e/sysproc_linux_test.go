package e2e

import "syscall"

// childProcAttr makes the kernel kill a Caddy process if the test process dies first (a
// test binary killed on timeout runs no cleanup), so that no instance outlives the test.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
