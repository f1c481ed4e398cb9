// Package transport is the one place where rewind's daemons, its CLI and
// its SDK listen and dial. It owns transport security: TLS 1.3 with
// mutual authentication on every TCP connection (gRPC and the agents'
// peer data path alike), certificates read from a directory in the
// layout cert-manager and SPIFFE helpers write (tls.crt, tls.key,
// ca.crt) and read again when they change on disk; the identity and role
// a peer's certificate names (identity.go); and the table of which role
// may call which gRPC method (rules.go), enforced by the interceptors of
// authz.go.
//
// Plaintext is for loopback only: a *Security that is nil listens and
// dials in plaintext on loopback addresses and refuses any other, and
// Insecure() lifts that, loudly. Unix-socket connections (a rank and its
// node's agent) never use TLS; their callers are local processes.
//
// Who may call what concurrently: a *Security is safe for concurrent use
// by any number of listeners and dialers, and reloads its files under
// its own lock.
package transport
