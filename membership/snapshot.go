package membership

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/memberlist"
)

// memberlist tells its EventDelegate about joins, deaths and metadata
// updates, but not about suspicions, nor whether a member died or left:
// the Node.State it passes and returns from Members() is never set (its
// table keeps the state in a field of its own, hashicorp/memberlist#266),
// and the nodes Members() returns point into its table, so reading them
// races with its writers. The one race-free copy of the table it gives
// out is the push/pull state exchange it answers on any stream: it copies
// the table under its lock and writes it back. So this package opens an
// in-process stream to its own memberlist (transport.openLocal), sends a
// push/pull request carrying no nodes (which merges nothing) and reads the
// table from the answer. The message layout is memberlist's wire protocol,
// which it keeps compatible across versions; compression is off
// (Config.memberlistConfig) so the answer is plain.

// pushPullMsg is memberlist's message type for a state exchange; the
// numbering is part of its protocol ("only append to this list").
const pushPullMsg byte = 6

// pushPullHeader and pushNodeState mirror memberlist's wire structs; the
// msgpack encoding keys fields by name.
type pushPullHeader struct {
	Nodes        int
	UserStateLen int
	Join         bool
}

type pushNodeState struct {
	Name        string
	Addr        []byte
	Port        uint16
	Meta        []byte
	Incarnation uint32
	State       memberlist.NodeStateType
	Vsn         []uint8
}

// maxSnapshotNodes bounds what a snapshot may claim to hold.
const maxSnapshotNodes = 1 << 20

// nodeState is one row of memberlist's node table.
type nodeState struct {
	Name        string
	Addr        string
	Incarnation uint32
	State       memberlist.NodeStateType
}

// readNodeTable returns memberlist's node table, dead members included.
// With gossip keys (kr), the request and the answer are encrypted
// (seal.go); label is the cluster's.
func readNodeTable(t *transport, timeout time.Duration, label string, kr *memberlist.Keyring) ([]nodeState, error) {
	conn, err := t.openLocal(timeout)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return nil, err
	}
	var h codec.MsgpackHandle
	var req bytes.Buffer
	req.WriteByte(pushPullMsg)
	if err := codec.NewEncoder(&req, &h).Encode(&pushPullHeader{}); err != nil {
		return nil, fmt.Errorf("membership: encoding a state request: %w", err)
	}
	msg := req.Bytes()
	if kr != nil {
		if msg, err = sealStream(kr.GetPrimaryKey(), msg, label); err != nil {
			return nil, err
		}
	}
	if err := memberlist.AddLabelHeaderToStream(conn, label); err != nil {
		return nil, fmt.Errorf("membership: sending a state request: %w", err)
	}
	if _, err := conn.Write(msg); err != nil {
		return nil, fmt.Errorf("membership: sending a state request: %w", err)
	}
	br := bufio.NewReader(conn)
	typ, err := br.ReadByte()
	if err != nil {
		return nil, fmt.Errorf("membership: reading the node table: %w", err)
	}
	var r io.Reader = br
	if typ == encryptMsg && kr != nil {
		plain, err := openStream(br, kr.GetKeys(), label)
		if err == nil && len(plain) == 0 {
			err = errors.New("an empty message")
		}
		if err != nil {
			return nil, fmt.Errorf("membership: reading the node table: %w", err)
		}
		typ, r = plain[0], bytes.NewReader(plain[1:])
	}
	if typ != pushPullMsg {
		return nil, fmt.Errorf("membership: memberlist answered message type %d, want %d (push/pull)", typ, pushPullMsg)
	}
	dec := codec.NewDecoder(r, &h)
	var hdr pushPullHeader
	if err := dec.Decode(&hdr); err != nil {
		return nil, fmt.Errorf("membership: reading the node table header: %w", err)
	}
	if hdr.Nodes < 0 || hdr.Nodes > maxSnapshotNodes {
		return nil, fmt.Errorf("membership: node table claims %d nodes", hdr.Nodes)
	}
	nodes := make([]nodeState, 0, hdr.Nodes)
	for range hdr.Nodes {
		var n pushNodeState
		if err := dec.Decode(&n); err != nil {
			return nil, fmt.Errorf("membership: reading the node table: %w", err)
		}
		nodes = append(nodes, nodeState{
			Name:        n.Name,
			Addr:        net.JoinHostPort(net.IP(n.Addr).String(), strconv.Itoa(int(n.Port))),
			Incarnation: n.Incarnation,
			State:       n.State,
		})
	}
	return nodes, nil
}
