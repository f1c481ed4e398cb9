package child

import "syscall"

// SysProcAttr puts a child in its own process group and has the kernel
// kill it if the parent dies first.
func SysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
