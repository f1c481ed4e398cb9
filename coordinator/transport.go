package coordinator

import "rewind.dev/rewind/transport"

// initTransport sets up the audit log and the authorizer of the
// coordinator's gRPC server, and the transport's metrics.
func (c *Coordinator) initTransport() error {
	var err error
	if c.audit, err = openAudit(c.cfg, c.store.db, c.cfg.Registry); err != nil {
		return err
	}
	c.auditor = transport.NewAudit(auditRules, c.cfg.Clock, c.audit.record)
	if c.authz, err = transport.NewAuthorizer(c.cfg.Transport, c.log, c.cfg.Registry); err != nil {
		return err
	}
	return c.cfg.Transport.Register(c.cfg.Registry)
}
