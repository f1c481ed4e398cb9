//go:build !linux

package nodeproc

import "syscall"

func sysProcAttr() *syscall.SysProcAttr { return nil }
