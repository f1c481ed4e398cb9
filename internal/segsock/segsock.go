// Package segsock is the wire of the agent's segment socket: a
// SOCK_SEQPACKET Unix socket beside the agent's gRPC socket over which a
// rank asks for a segment (agentpb.SegmentRequest, one per packet) and
// the agent answers (agentpb.SegmentResponse, one packet), passing the
// segment's file descriptor with SCM_RIGHTS when it grants the request.
// The shared-memory root is the agent's alone: this is the only way a
// rank reaches a segment. The agent serves it; the Go SDK dials it (the
// Python SDK speaks the same wire).
package segsock

import (
	"fmt"
	"io"
	"net"
	"os"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

// Suffix is appended to the gRPC socket's path to name the segment
// socket: /run/rewind/agent.sock → /run/rewind/agent.sock.seg.
const Suffix = ".seg"

// Path returns the segment socket of the agent whose gRPC socket is at
// socket.
func Path(socket string) string { return socket + Suffix }

// Network is the socket type: packets keep message boundaries, so each
// message is one read and one write, its descriptor attached to it.
const Network = "unixpacket"

// MaxPacket bounds a message: a request names a job (128 bytes at most)
// and a token; an answer carries a one-line reason.
const MaxPacket = 8 << 10

// File is what Write passes the descriptor of.
type File interface{ Fd() uintptr }

// Write sends m in one packet, with the descriptor of f attached when f
// is not nil.
func Write(c *net.UnixConn, m proto.Message, f File) error {
	b, err := proto.Marshal(m)
	if err != nil {
		return fmt.Errorf("segsock: %w", err)
	}
	if len(b) > MaxPacket {
		return fmt.Errorf("segsock: message of %d bytes, the limit is %d", len(b), MaxPacket)
	}
	var oob []byte
	if f != nil {
		oob = unix.UnixRights(int(f.Fd()))
	}
	if _, _, err := c.WriteMsgUnix(b, oob, nil); err != nil {
		return fmt.Errorf("segsock: write: %w", err)
	}
	return nil
}

// Read receives one packet into m; the descriptors that came with it are
// returned as files, which the caller must close.
func Read(c *net.UnixConn, m proto.Message) ([]*os.File, error) {
	buf := make([]byte, MaxPacket+1)
	oob := make([]byte, unix.CmsgSpace(4*4)) // room for a few descriptors: any beyond are closed by the kernel
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, err
	}
	files, ferr := parseRights(oob[:oobn])
	if n == 0 { // the peer hung up (no message of this wire is empty)
		closeAll(files)
		return nil, io.EOF
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		closeAll(files)
		return nil, fmt.Errorf("segsock: a packet or its descriptors were truncated (flags %#x)", flags)
	}
	if ferr != nil {
		closeAll(files)
		return nil, ferr
	}
	if err := proto.Unmarshal(buf[:n], m); err != nil {
		closeAll(files)
		return nil, fmt.Errorf("segsock: decoding a %d-byte packet: %w", n, err)
	}
	return files, nil
}

func parseRights(oob []byte) ([]*os.File, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("segsock: control message: %w", err)
	}
	var files []*os.File
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue // not SCM_RIGHTS
		}
		for _, fd := range fds {
			unix.CloseOnExec(fd)
			files = append(files, os.NewFile(uintptr(fd), "segment"))
		}
	}
	return files, nil
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}
