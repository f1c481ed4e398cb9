package sdk

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/internal/segsock"
)

// tokenMetadata is the gRPC metadata key of the job token (the agent's
// agent.TokenMetadata).
const tokenMetadata = "rewind-job-token"

// jobToken returns the token the options give, else $REWIND_JOB_TOKEN,
// else the contents of the file $REWIND_JOB_TOKEN_FILE names (a
// Kubernetes Secret's key, mounted), else "".
func jobToken(o Options) (string, error) {
	if o.JobToken != "" {
		return o.JobToken, nil
	}
	if t := os.Getenv("REWIND_JOB_TOKEN"); t != "" {
		return t, nil
	}
	if p := os.Getenv("REWIND_JOB_TOKEN_FILE"); p != "" {
		b, err := os.ReadFile(p)
		if err != nil {
			return "", fmt.Errorf("job token: %w", err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	return "", nil
}

// tokenInterceptors add the job token to every call's metadata.
func tokenInterceptors(token string) []grpc.DialOption {
	if token == "" {
		return nil
	}
	withToken := func(ctx context.Context) context.Context {
		return metadata.AppendToOutgoingContext(ctx, tokenMetadata, token)
	}
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			return invoker(withToken(ctx), method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			return streamer(withToken(ctx), desc, cc, method, opts...)
		}),
	}
}

// segments is the client's connection to the agent's segment socket,
// dialed at first use and kept; one request at a time.
type segments struct {
	path  string
	token string
	mu    sync.Mutex
	conn  *net.UnixConn
}

// open asks the agent for a segment's file descriptor, as req grants it;
// the caller closes the file.
func (s *segments) open(ctx context.Context, timeout time.Duration, req *agentpb.SegmentRequest) (*os.File, *agentpb.SegmentResponse, error) {
	req.JobToken = s.token
	s.mu.Lock()
	defer s.mu.Unlock()
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	var resp agentpb.SegmentResponse
	var files []*os.File
	// A kept connection may belong to an agent that has since restarted:
	// on failure it is dialed anew, once (asking for a descriptor twice
	// is harmless).
	for _, fresh := range []bool{s.conn == nil, true} {
		var err error
		if files, err = s.exchange(ctx, deadline, req, &resp); err == nil {
			break
		}
		if s.conn != nil {
			s.conn.Close() // broken or desynchronized: dial anew
			s.conn = nil
		}
		if fresh {
			return nil, nil, status.Errorf(codes.Unavailable, "segment socket %s: %v", s.path, err)
		}
	}
	if resp.Code != uint32(codes.OK) {
		closeFiles(files)
		return nil, nil, status.Error(codes.Code(resp.Code), resp.Error)
	}
	if len(files) != 1 {
		closeFiles(files)
		return nil, nil, status.Errorf(codes.Internal, "segment socket %s: the agent granted a segment with %d descriptors, not one", s.path, len(files))
	}
	return files[0], &resp, nil
}

// exchange sends req and reads the answer, dialing first when there is
// no connection; the caller holds s.mu.
func (s *segments) exchange(ctx context.Context, deadline time.Time, req *agentpb.SegmentRequest, resp *agentpb.SegmentResponse) ([]*os.File, error) {
	if s.conn == nil {
		var d net.Dialer
		c, err := d.DialContext(ctx, segsock.Network, s.path)
		if err != nil {
			return nil, err
		}
		s.conn = c.(*net.UnixConn)
	}
	_ = s.conn.SetDeadline(deadline)
	if err := segsock.Write(s.conn, req, nil); err != nil {
		return nil, err
	}
	return segsock.Read(s.conn, resp)
}

func (s *segments) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn != nil {
		s.conn.Close()
		s.conn = nil
	}
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}
