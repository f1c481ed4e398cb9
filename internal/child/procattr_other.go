//go:build !linux

package child

import "syscall"

// SysProcAttr puts a child in its own process group.
func SysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
