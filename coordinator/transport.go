package coordinator

import "rewind.dev/rewind/transport"

// initTransport sets up the authorizer of the coordinator's gRPC server
// and the transport's metrics.
func (c *Coordinator) initTransport() error {
	var err error
	if c.authz, err = transport.NewAuthorizer(c.cfg.Transport, c.log, c.cfg.Registry); err != nil {
		return err
	}
	return c.cfg.Transport.Register(c.cfg.Registry)
}
