package sdk

import (
	"context"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/transport"
)

// agentConn is a client's gRPC connection to the agent, dialed anew once a
// call has found no agent.
//
// gRPC reconnects a connection that lost its server on its own schedule,
// with a backoff growing 1.6 times per failed attempt up to 120 s, and
// fails every call until an attempt succeeds (pick_first's sticky
// transient failure): a rank whose agent was away for some seconds went
// on failing its saves for about as long again after the agent was back,
// while a new client worked at once. So a call that finds no agent marks
// its connection broken, and the next call dials a new one, whose first
// attempt reaches an agent that is back. The backoff of a connection that
// loses its agent between two calls is capped at a second: a reconnect is
// one connect(2) on a local socket. The Python SDK's channel.py does the
// same.
//
// It is safe for concurrent use. A broken connection is replaced only for
// calls that start after it broke, and closed once no call or stream is
// using it.
type agentConn struct {
	socket string
	opts   []grpc.DialOption
	mu     sync.Mutex
	cur    *conn // nil once closed
}

// conn is one gRPC connection of an agentConn; guarded by its mu.
type conn struct {
	cc      *grpc.ClientConn
	users   int  // calls and streams in flight on it
	broken  bool // a call found no agent: the next call dials anew
	retired bool // replaced: closed when its last user is done
}

var _ grpc.ClientConnInterface = (*agentConn)(nil)

// connectParams cap gRPC's reconnect backoff for the agent's local socket.
var connectParams = grpc.ConnectParams{
	Backoff: backoff.Config{
		BaseDelay:  100 * time.Millisecond, // an agent restarted by its supervisor is back within a fraction of a second
		Multiplier: 1.6,
		Jitter:     0.2,
		MaxDelay:   time.Second, // one connect(2) a second costs nothing while the agent is away
	},
	MinConnectTimeout: 5 * time.Second, // connecting to a local socket takes microseconds
}

func dialAgent(socket string, opts []grpc.DialOption) (*agentConn, error) {
	opts = append([]grpc.DialOption{grpc.WithConnectParams(connectParams)}, opts...)
	cc, err := transport.NewUnixClient(socket, opts...)
	if err != nil {
		return nil, err
	}
	return &agentConn{socket: socket, opts: opts, cur: &conn{cc: cc}}, nil
}

// Invoke implements grpc.ClientConnInterface.
func (a *agentConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	c, err := a.acquire()
	if err != nil {
		return err
	}
	err = c.cc.Invoke(ctx, method, args, reply, opts...)
	a.done(c, noAgent(err))
	return err
}

// NewStream implements grpc.ClientConnInterface; the stream uses its
// connection until it ends (an error or the end of the stream from
// RecvMsg) or its context is done.
func (a *agentConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	c, err := a.acquire()
	if err != nil {
		return nil, err
	}
	s, err := c.cc.NewStream(ctx, desc, method, opts...)
	if err != nil {
		a.done(c, noAgent(err))
		return nil, err
	}
	st := &stream{ClientStream: s, a: a, c: c}
	st.stop = context.AfterFunc(ctx, func() { st.end(false) })
	return st, nil
}

// acquire returns the connection for a new call, dialing a new one when
// the current one is broken.
func (a *agentConn) acquire() (*conn, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.cur
	if c == nil {
		return nil, status.Error(codes.Canceled, "sdk: the client is closed")
	}
	if c.broken {
		cc, err := transport.NewUnixClient(a.socket, a.opts...)
		if err != nil {
			return nil, status.Errorf(codes.Unavailable, "sdk: dialing %s: %v", a.socket, err)
		}
		c.retired = true
		if c.users == 0 {
			go c.cc.Close() // nothing uses it: Close waits for its goroutines
		}
		c = &conn{cc: cc}
		a.cur = c
	}
	c.users++
	return c, nil
}

// done ends a use of c; broken says the call found no agent.
func (a *agentConn) done(c *conn, broken bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	c.users--
	c.broken = c.broken || broken
	if c.retired && c.users == 0 {
		go c.cc.Close()
	}
}

// close closes the connection; later calls fail.
func (a *agentConn) close() error {
	a.mu.Lock()
	c := a.cur
	a.cur = nil
	if c != nil {
		c.retired = true
	}
	a.mu.Unlock()
	if c == nil {
		return nil
	}
	return c.cc.Close() // calls in flight on it are cancelled
}

// noAgent says whether err means the agent is not there (the transport's
// Unavailable), not the agent's own answer about its coordinator.
func noAgent(err error) bool {
	st, ok := status.FromError(err)
	return ok && st.Code() == codes.Unavailable && !strings.HasPrefix(st.Message(), "agent: coordinator")
}

// stream is a stream on one of an agentConn's connections.
type stream struct {
	grpc.ClientStream
	a    *agentConn
	c    *conn
	once sync.Once
	stop func() bool
}

func (s *stream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err != nil {
		s.stop()
		s.end(noAgent(err))
	}
	return err
}

// end ends the stream's use of its connection, once.
func (s *stream) end(broken bool) {
	s.once.Do(func() { s.a.done(s.c, broken) })
}
