package main

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"rewind.dev/rewind/transport"
)

// EnvTLSDir names the certificate directory of commands not given
// --tls-dir: an operator's shell sets it once.
const EnvTLSDir = "REWIND_TLS_DIR"

// tlsFlags say how a command protects its TCP connections (transport).
type tlsFlags struct {
	dir, trustDomain string
	insecure         bool
}

func (t *tlsFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&t.dir, "tls-dir", os.Getenv(EnvTLSDir), "directory holding tls.crt, tls.key and ca.crt (cert-manager's Secret layout; rewind certs makes them): "+
		"mutual TLS on every TCP connection, files read again when they change (default $"+EnvTLSDir+")")
	fs.BoolVar(&t.insecure, "insecure", false, "plaintext TCP on any address, with no authentication: only for a network protected by other means "+
		"(without it and without --tls-dir, TCP is allowed on loopback addresses only)")
	fs.StringVar(&t.trustDomain, "tls-trust-domain", transport.DefaultTrustDomain, "trust domain of the SPIFFE IDs that certificates name (spiffe://DOMAIN/ROLE/NAME)")
}

// security loads what the flags name.
func (t *tlsFlags) security(log *slog.Logger) (*transport.Security, error) {
	return transport.New(transport.Config{Dir: t.dir, Insecure: t.insecure, TrustDomain: t.trustDomain, Logger: log})
}

// daemonSecurity is security for a daemon whose own certificate must
// name role, and for an agent speak for its node (node/NODE or node/*).
// Any other is refused at start, naming it: the daemon would run, and its
// peers refuse it at every call (an agent started in an operator's shell,
// whose $REWIND_TLS_DIR names the operator's certificate).
func (t *tlsFlags) daemonSecurity(log *slog.Logger, role transport.Role, node string) (*transport.Security, error) {
	sec, err := t.security(log)
	if err != nil || !sec.TLS() {
		return sec, err
	}
	id := sec.Identity()
	if id.Role == role && (role != transport.RoleNode || id.SpeaksFor(node)) {
		return sec, nil
	}
	from := "--tls-dir"
	if t.dir == os.Getenv(EnvTLSDir) {
		from = "$" + EnvTLSDir + ", the default of --tls-dir"
	}
	want := "the coordinator needs a coordinator's (coordinator/NAME)"
	if role == transport.RoleNode {
		want = fmt.Sprintf("the agent of node %s needs a node's (node/%s, or node/%s)", node, node, transport.AnyNode)
	}
	return nil, fmt.Errorf("the certificate in %s (%s) is %s's; %s", t.dir, from, id, want)
}

// tlsFromArgs reads the TLS flags out of another command's arguments
// (rewind node reads the agent's, after --).
func tlsFromArgs(args []string) tlsFlags {
	t := tlsFlags{dir: flagValue(args, "tls-dir", os.Getenv(EnvTLSDir)), trustDomain: flagValue(args, "tls-trust-domain", transport.DefaultTrustDomain)}
	for _, a := range args {
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if a == "--" {
			break
		}
		if strings.HasPrefix(a, "-") && name == "insecure" {
			t.insecure = true
			if hasVal {
				t.insecure, _ = strconv.ParseBool(val)
			}
		}
	}
	return t
}
