package membership

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/hashicorp/memberlist"
)

// Role is what a member does in the cluster.
type Role string

// Roles.
const (
	RoleAgent       Role = "agent"
	RoleCoordinator Role = "coordinator"
)

// Meta is what a member tells the others about itself. It travels in
// memberlist's node metadata, so it is small: MetaMaxSize bytes encoded.
type Meta struct {
	// Role is agent or coordinator.
	Role Role
	// Domain is the failure domain (rack, switch): replicas go to other
	// domains, restores prefer the same one. May be empty.
	Domain string
	// GRPCAddr is the host:port of the member's gRPC service (an agent's
	// peer service; the coordinator's API).
	GRPCAddr string
}

// MetaMaxSize is memberlist's limit on a node's metadata.
const MetaMaxSize = memberlist.MetaMaxSize

// ErrBadMeta is wrapped by every error decoding another member's metadata.
var ErrBadMeta = errors.New("bad node metadata")

// The encoding: a version byte, a role byte, a flags byte, then the domain
// and the gRPC address, each as a uvarint length and UTF-8 bytes. Binary
// rather than JSON so that a long domain name fits the 512-byte limit with
// room left.
const (
	metaVersion     byte = 1
	roleAgentB      byte = 1
	roleCoordinator byte = 2
	flagLeaving     byte = 1 << 0 // the member is leaving gracefully (Leave)
)

func roleByte(r Role) (byte, bool) {
	switch r {
	case RoleAgent:
		return roleAgentB, true
	case RoleCoordinator:
		return roleCoordinator, true
	}
	return 0, false
}

// Validate checks that the metadata can be encoded within MetaMaxSize.
func (m Meta) Validate() error {
	_, err := m.encode(false)
	return err
}

func (m Meta) encode(leaving bool) ([]byte, error) {
	rb, ok := roleByte(m.Role)
	if !ok {
		return nil, fmt.Errorf("role %q is neither %q nor %q", m.Role, RoleAgent, RoleCoordinator)
	}
	if !utf8.ValidString(m.Domain) {
		return nil, fmt.Errorf("failure domain %q is not UTF-8", m.Domain)
	}
	if !utf8.ValidString(m.GRPCAddr) {
		return nil, fmt.Errorf("gRPC address %q is not UTF-8", m.GRPCAddr)
	}
	var flags byte
	if leaving {
		flags |= flagLeaving
	}
	b := []byte{metaVersion, rb, flags}
	b = binary.AppendUvarint(b, uint64(len(m.Domain)))
	b = append(b, m.Domain...)
	b = binary.AppendUvarint(b, uint64(len(m.GRPCAddr)))
	b = append(b, m.GRPCAddr...)
	if len(b) > MetaMaxSize {
		return nil, fmt.Errorf("metadata is %d bytes encoded, limit %d (failure domain %d bytes, gRPC address %d bytes)",
			len(b), MetaMaxSize, len(m.Domain), len(m.GRPCAddr))
	}
	return b, nil
}

// decodeMeta decodes metadata another member sent, and whether it is
// leaving. Errors wrap ErrBadMeta.
func decodeMeta(b []byte) (Meta, bool, error) {
	m, leaving, err := decodeMetaFields(b)
	if err != nil {
		return Meta{}, false, fmt.Errorf("%w: %v", ErrBadMeta, err)
	}
	return m, leaving, nil
}

func decodeMetaFields(b []byte) (Meta, bool, error) {
	bad := func(format string, args ...any) (Meta, bool, error) {
		return Meta{}, false, fmt.Errorf(format, args...)
	}
	if len(b) == 0 {
		return bad("empty")
	}
	if len(b) > MetaMaxSize {
		return bad("%d bytes, limit %d", len(b), MetaMaxSize)
	}
	if b[0] != metaVersion {
		return bad("version %d, this build reads version %d", b[0], metaVersion)
	}
	if len(b) < 3 {
		return bad("%d bytes, truncated before the flags", len(b))
	}
	var m Meta
	switch b[1] {
	case roleAgentB:
		m.Role = RoleAgent
	case roleCoordinator:
		m.Role = RoleCoordinator
	default:
		return bad("role byte %d unknown", b[1])
	}
	if b[2]&^flagLeaving != 0 {
		return bad("flags %#x unknown", b[2])
	}
	rest := b[3:]
	var err error
	if m.Domain, rest, err = readString(rest); err != nil {
		return bad("failure domain: %v", err)
	}
	if m.GRPCAddr, rest, err = readString(rest); err != nil {
		return bad("gRPC address: %v", err)
	}
	if len(rest) != 0 {
		return bad("%d trailing bytes", len(rest))
	}
	return m, b[2]&flagLeaving != 0, nil
}

func readString(b []byte) (string, []byte, error) {
	n, k := binary.Uvarint(b)
	if k <= 0 {
		return "", nil, errors.New("truncated length")
	}
	if k != len(binary.AppendUvarint(nil, n)) {
		return "", nil, errors.New("length not minimally encoded") // one encoding per value
	}
	b = b[k:]
	if n > uint64(len(b)) {
		return "", nil, fmt.Errorf("length %d, only %d bytes left", n, len(b))
	}
	s := string(b[:n])
	if !utf8.ValidString(s) {
		return "", nil, errors.New("not UTF-8")
	}
	return s, b[n:], nil
}
