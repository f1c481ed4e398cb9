package miniotest

import "syscall"

// sysProcAttr makes the kernel kill the server when the test process dies,
// so a crashed or interrupted test leaves no MinIO behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
