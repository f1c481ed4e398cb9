// Package freeport finds loopback TCP ports that are free at the time of
// the call, for whoever must name a server's address before the server
// listens (a process started with --listen, a cluster's port map). The
// port may be taken by another process before the server binds it: a
// caller that cannot retry should let the server pick its own port
// (127.0.0.1:0) instead.
package freeport

import (
	"fmt"
	"net"
)

// Addr returns "127.0.0.1:port" with a port free now.
func Addr() (string, error) {
	ports, err := Ports(1)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("127.0.0.1:%d", ports[0]), nil
}

// Ports returns n distinct ports free on 127.0.0.1 now: each is held
// until all are found, so none is returned twice.
func Ports(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	out := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("freeport: no free port on 127.0.0.1: %w", err)
		}
		ls = append(ls, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

// Pick returns Addr's address, or 127.0.0.1:0 (the listener picks its
// port) when no free port is found: for a local cluster's processes,
// whose start fails clearly if the port is taken meanwhile.
func Pick() string {
	a, err := Addr()
	if err != nil {
		return "127.0.0.1:0"
	}
	return a
}
