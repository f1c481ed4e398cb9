package transport

import (
	"net"

	"golang.org/x/sys/unix"
)

// UnixCred returns the credentials of the process at the other end of a
// Unix socket connection as the kernel recorded them when it connected
// (SO_PEERCRED), or nil when they cannot be read.
func UnixCred(c *net.UnixConn) *Cred {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil
	}
	var uc *unix.Ucred
	var gerr error
	if err := raw.Control(func(fd uintptr) { uc, gerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil || gerr != nil {
		return nil
	}
	return &Cred{PID: uc.Pid, UID: uc.Uid, GID: uc.Gid}
}
