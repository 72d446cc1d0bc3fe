package fleet

import "syscall"

// ChildProcAttr makes the kernel kill a child if the process that started it dies first
// (a test binary killed on timeout runs no cleanup, nor does a demo killed with SIGKILL),
// so that no instance outlives its starter.
func ChildProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
