package nodeproc

import "syscall"

// sysProcAttr has the kernel kill a rank if the supervisor dies first, as
// the container's other processes die with its first one.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
