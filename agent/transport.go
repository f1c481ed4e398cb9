package agent

import "rewind.dev/rewind/transport"

// initTransport sets up what protects the agent's TCP connections: the
// authorizer of its gRPC server and data path, the connections to its
// peers, and the transport's metrics.
func (a *Agent) initTransport() error {
	sec := a.cfg.Transport
	var err error
	if a.authz, err = transport.NewAuthorizer(sec, a.log, a.cfg.Registry); err != nil {
		return err
	}
	a.peers.sec = sec
	return sec.Register(a.cfg.Registry)
}
