package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/internal/segsock"
	"rewind.dev/rewind/transport"
	"rewind.dev/rewind/vfs"
)

// The segment socket (internal/segsock) hands a rank the file descriptor
// of a segment: writable for the slot its Prepare is having it write
// (the request carries the Prepare's token), read-only for a shard it
// holds a lease on (from Open). A rank asks once per segment and keeps
// the mapping across saves; the shared-memory root itself is the agent's
// alone. The caller's job token is checked as on the gRPC socket
// (jobauth.go), and its credentials (SO_PEERCRED) name it in every
// refusal.

// serveSegments accepts connections on the segment socket until l is
// closed; each is served by its own goroutine until the peer hangs up.
// A failed accept (out of descriptors: a local process holding many
// connections) is logged and retried after a pause that doubles up to a
// second, so it cannot stop the agent.
func (a *Agent) serveSegments(ctx context.Context, l net.Listener) {
	var pause time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
			a.log.Warn("segment socket: accept failed; retrying", "err", err, "pause", pause)
			select {
			case <-ctx.Done():
				return
			case <-time.After(pause):
			}
			continue
		}
		pause = 0
		uc, ok := c.(*net.UnixConn)
		if !ok {
			c.Close()
			continue
		}
		go a.serveSegmentConn(ctx, uc)
	}
}

func (a *Agent) serveSegmentConn(ctx context.Context, c *net.UnixConn) {
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	cred := transport.UnixCred(c)
	for {
		var req agentpb.SegmentRequest
		files, err := segsock.Read(c, &req)
		for _, f := range files { // a rank has no descriptor to give
			f.Close()
		}
		if err != nil {
			return // hung up, or spoke garbage: either way the connection ends
		}
		f, resp := a.grantSegment(&req, cred)
		if f != nil {
			err = segsock.Write(c, resp, f)
			f.Close()
		} else {
			err = segsock.Write(c, resp, nil)
		}
		if err != nil {
			return
		}
	}
}

// grantSegment answers one request: the segment's file, open for the
// grant the request holds, or a refusal saying why.
func (a *Agent) grantSegment(req *agentpb.SegmentRequest, cred *transport.Cred) (vfs.File, *agentpb.SegmentResponse) {
	f, err := a.openSegment(req, cred)
	if err != nil {
		st := status.Convert(toStatus(err))
		return nil, &agentpb.SegmentResponse{Code: uint32(st.Code()), Error: st.Message()}
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, &agentpb.SegmentResponse{Code: uint32(codes.Internal), Error: "agent: segment: " + err.Error()}
	}
	return f, &agentpb.SegmentResponse{SizeBytes: uint64(fi.Size()), SegmentId: inode(fi)}
}

// openSegment checks the request against the job's token and the
// rank's slots, and opens the segment it grants.
func (a *Agent) openSegment(req *agentpb.SegmentRequest, cred *transport.Cred) (vfs.File, error) {
	if err := validateRank(req.Job, req.Rank, 0); err != nil {
		return nil, err
	}
	if err := a.checkJobToken(req.Job, req.JobToken, cred, "a segment"); err != nil {
		return nil, err
	}
	if g, ok := req.Grant.(*agentpb.SegmentRequest_Lease); ok {
		if p := a.partialOf(g.Lease); p != nil { // a shard of another node's, open partially
			if p.ps.Job != req.Job || p.ps.Rank != req.Rank {
				return nil, fmt.Errorf("%w: agent: lease %d is not on job %s rank %d", ErrNotFound, g.Lease, req.Job, req.Rank)
			}
			return a.cfg.FS.OpenFile(p.path, os.O_RDONLY, 0)
		}
	}
	// A rank with no segments here holds no grant either (the agent
	// restarted since, on a node that kept none of them).
	var s *slot
	r := a.rank(req.Job, req.Rank, false)
	if r != nil {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, c := range r.slots {
			if c.Index == req.Slot {
				s = c
			}
		}
	}
	switch g := req.Grant.(type) {
	case *agentpb.SegmentRequest_SaveToken:
		if s == nil || s.State != stateWriting || s.token != g.SaveToken {
			return nil, fmt.Errorf("%w: agent: slot %d of job %s rank %d is not being written by the holder of this save's token (a later save took it over?)",
				ErrBusy, req.Slot, req.Job, req.Rank)
		}
		return a.openSlotFile(r, s, os.O_RDWR)
	case *agentpb.SegmentRequest_Lease:
		a.mu.Lock()
		l := a.leases[g.Lease]
		a.mu.Unlock()
		if l == nil || s == nil || l.r != r || l.s != s {
			// Not ErrNotFound: the shard may well be here (the lease
			// expired, or this agent restarted since it was given), and
			// a rank told "not found" at its restore would start over.
			return nil, fmt.Errorf("%w: agent: no lease %d on slot %d of job %s rank %d (expired, released, or given by the agent before a restart); open the shard again",
				ErrBusy, g.Lease, req.Slot, req.Job, req.Rank)
		}
		return a.openSlotFile(r, s, os.O_RDONLY)
	}
	return nil, fmt.Errorf("%w: agent: a segment request names neither a save's token nor a lease", ErrInvalid)
}

// openSlotFile opens a slot's segment; the caller holds r.mu.
func (a *Agent) openSlotFile(r *lockedRank, s *slot, flag int) (vfs.File, error) {
	f, err := a.cfg.FS.OpenFile(a.paths.Segment(r.job, r.rank, s.Index), flag, 0)
	if err != nil {
		return nil, fmt.Errorf("agent: segment of job %s rank %d slot %d: %w", r.job, r.rank, s.Index, err)
	}
	return f, nil
}

// inode returns a file's inode number, or 0 where the file system does
// not say.
func inode(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}
