package transport

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
)

// A Role is what a certificate's holder may do (rules.go has the table).
type Role uint8

const (
	// RoleNone is no role: a peer without a verified certificate.
	RoleNone Role = iota
	// RoleNode is a node's agent, and the supervisor of the ranks on it:
	// it reports only for its own node.
	RoleNode
	// RoleCoordinator is the coordinator (and the Kubernetes controller
	// inside it): it orders agents about and acts for operators.
	RoleCoordinator
	// RoleOperator may do what a reader may, and change things: delete,
	// restore, set policies, declare nodes down.
	RoleOperator
	// RoleReader may list, inspect and verify.
	RoleReader
)

var roleNames = [...]string{RoleNone: "none", RoleNode: "node", RoleCoordinator: "coordinator", RoleOperator: "operator", RoleReader: "reader"}

func (r Role) String() string {
	if int(r) < len(roleNames) {
		return roleNames[r]
	}
	return fmt.Sprintf("role(%d)", r)
}

// ParseRole parses a role's name ("node", "coordinator", "operator",
// "reader").
func ParseRole(s string) (Role, error) {
	for r, n := range roleNames {
		if n == s && Role(r) != RoleNone {
			return Role(r), nil
		}
	}
	return RoleNone, fmt.Errorf("transport: unknown role %q (want node, coordinator, operator or reader)", s)
}

// DefaultTrustDomain is the trust domain of rewind's identities, the host
// of their SPIFFE IDs: spiffe://rewind/node/gpu-17.
const DefaultTrustDomain = "rewind"

// AnyNode is the name of a node certificate that every node shares (a
// Kubernetes Secret mounted by every agent of a DaemonSet): its holder
// may speak for any node. Per-node certificates are stronger: a node that
// holds one can report only for itself.
const AnyNode = "*"

// Identity is who a certificate says its holder is: a role and a name
// (the node's name for RoleNode; any label for the others). It is
// carried as the certificate's one URI SAN,
// spiffe://TRUST-DOMAIN/ROLE/NAME.
type Identity struct {
	Role Role
	Name string
}

func (id Identity) String() string {
	if id.Role == RoleNone {
		return "an unauthenticated peer"
	}
	return id.Role.String() + "/" + id.Name
}

// SpeaksFor reports whether id may act for node: it is node's own
// certificate, or one every node shares.
func (id Identity) SpeaksFor(node string) bool {
	return id.Role == RoleNode && (id.Name == node || id.Name == AnyNode)
}

// names are what an identity's name may be: a node name's characters
// (DNS labels and dots, underscores), or AnyNode for a node.
var names = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$`)

// Validate reports what is wrong with id.
func (id Identity) Validate() error {
	if id.Role == RoleNone || int(id.Role) >= len(roleNames) {
		return fmt.Errorf("transport: identity %q has no role", id.Name)
	}
	if id.Name == AnyNode && id.Role == RoleNode {
		return nil
	}
	if !names.MatchString(id.Name) {
		return fmt.Errorf("transport: identity name %q: want letters, digits, '.', '_' or '-' (at most 253)", id.Name)
	}
	return nil
}

// SPIFFE is id's SPIFFE ID in trustDomain, as text.
func (id Identity) SPIFFE(trustDomain string) string {
	return "spiffe://" + trustDomain + "/" + id.Role.String() + "/" + id.Name
}

// URI is id's SPIFFE ID in trustDomain.
func (id Identity) URI(trustDomain string) *url.URL {
	return &url.URL{Scheme: "spiffe", Host: trustDomain, Path: "/" + id.Role.String() + "/" + id.Name}
}

// IdentityOf reads the identity a certificate names: its URI SANs must
// hold exactly one SPIFFE ID of trustDomain, of the form
// spiffe://TRUST-DOMAIN/ROLE/NAME. The subject (CN, OU) is not read: it
// is free text that many issuers fill in their own way.
func IdentityOf(cert *x509.Certificate, trustDomain string) (Identity, error) {
	var found []*url.URL
	for _, u := range cert.URIs {
		if u.Scheme == "spiffe" && u.Host == trustDomain {
			found = append(found, u)
		}
	}
	switch len(found) {
	case 0:
		return Identity{}, fmt.Errorf("transport: certificate %q names no identity: want a URI SAN spiffe://%s/ROLE/NAME", subject(cert), trustDomain)
	case 1:
	default:
		return Identity{}, fmt.Errorf("transport: certificate %q names %d identities in spiffe://%s; want one", subject(cert), len(found), trustDomain)
	}
	parts := strings.Split(strings.TrimPrefix(found[0].Path, "/"), "/")
	if len(parts) != 2 {
		return Identity{}, fmt.Errorf("transport: certificate %q: identity %s is not spiffe://%s/ROLE/NAME", subject(cert), found[0], trustDomain)
	}
	role, err := ParseRole(parts[0])
	if err != nil {
		return Identity{}, fmt.Errorf("transport: certificate %q: %w", subject(cert), err)
	}
	id := Identity{Role: role, Name: parts[1]}
	if err := id.Validate(); err != nil {
		return Identity{}, fmt.Errorf("transport: certificate %q: %w", subject(cert), err)
	}
	return id, nil
}

// subject names a certificate in messages: its SPIFFE ID if it has a URI
// SAN, else its subject.
func subject(cert *x509.Certificate) string {
	if len(cert.URIs) > 0 {
		return cert.URIs[0].String()
	}
	return cert.Subject.String()
}

// ServerName is the DNS name a certificate of a serving role (node,
// coordinator) carries beside its SPIFFE ID: ROLE.TRUSTDOMAIN
// (node.rewind). A TLS client that checks a host name and not the URI
// (Prometheus, curl) verifies a rewind server with it as its server
// name: the chain is the CA's and the server is of that role, what
// ExpectNode("") and ExpectCoordinator check.
func ServerName(role Role, trustDomain string) string {
	if trustDomain == "" {
		trustDomain = DefaultTrustDomain
	}
	return role.String() + "." + trustDomain
}

// Expect is what a client requires of the server it dials: a role, and
// the name when it is not empty (a node certificate every node shares
// matches any name).
type Expect struct {
	Role Role
	Name string
}

// ExpectCoordinator is what agents, the CLI and the controller require of
// the coordinator.
var ExpectCoordinator = Expect{Role: RoleCoordinator}

// ExpectNode requires node's agent ("" for any node's).
func ExpectNode(node string) Expect { return Expect{Role: RoleNode, Name: node} }

func (e Expect) check(id Identity) error {
	switch {
	case id.Role != e.Role:
		return fmt.Errorf("transport: the server is %s, not a %s", id, e.Role)
	case e.Name != "" && id.Name != e.Name && !(id.Role == RoleNode && id.Name == AnyNode):
		return fmt.Errorf("transport: the server is %s, not %s/%s", id, e.Role, e.Name)
	}
	return nil
}

var errNoCert = errors.New("no client certificate")
