//go:build !linux

package goodput

import "syscall"

// sysProcAttr puts a child in its own process group, so that a Ctrl-C in
// the terminal reaches only the benchmark, which then cleans up.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
