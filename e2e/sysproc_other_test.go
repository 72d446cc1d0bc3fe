//go:build unix && !linux

package e2e

import "syscall"

// childProcAttr returns no special attributes: only Linux can tie a child's life to its
// parent's, so elsewhere a test binary killed on timeout may leave instances behind.
func childProcAttr() *syscall.SysProcAttr { return nil }
