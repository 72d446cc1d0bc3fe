//go:build !linux

package fleet

import "syscall"

// ChildProcAttr returns no special attributes: only Linux can tie a child's life to its
// parent's, so elsewhere a starter killed without cleanup may leave processes behind.
func ChildProcAttr() *syscall.SysProcAttr { return nil }
