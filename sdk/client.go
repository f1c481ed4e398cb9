package sdk

import (
	"context"
	"fmt"
	"math"
	"os"
	"strconv"
	"time"

	"google.golang.org/grpc"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/internal/segsock"
	"rewind.dev/rewind/shm"
)

// DefaultSocket is where the agent listens unless told otherwise.
const DefaultSocket = "/run/rewind/agent.sock"

// maxAnswer bounds one answer of the agent: gRPC's largest. An Open's
// answer carries every tensor's name and 1 MiB leaf hashes, which grow
// with the shard (the header's names, up to shm.MaxHeaderBytes, and 8
// bytes per MiB): 120,000 tensors with the names of a large optimizer's
// state are 9 MiB. The agent is the node's own, trusted with the shard's
// bytes already.
const maxAnswer = math.MaxInt32

// Options tune a Client.
type Options struct {
	// CallTimeout bounds every call to the agent that the caller's context
	// does not bound more tightly. A stuck agent must not hang training.
	CallTimeout time.Duration
	// Workers is how many goroutines copy and checksum; 0 picks
	// shm.DefaultWorkers.
	Workers int
	// JobToken is the job's token, for an agent that isolates jobs; empty
	// takes $REWIND_JOB_TOKEN, else the contents of the file
	// $REWIND_JOB_TOKEN_FILE names. A client acts for one job: the token
	// goes with every call.
	JobToken string
}

// DefaultOptions returns the options Dial uses when given none.
func DefaultOptions() Options {
	return Options{
		CallTimeout: 30 * time.Second, // covers sizing a cold multi-GiB segment
		Workers:     0,
	}
}

// Client is a connection to the node's agent. It is safe for concurrent use.
type Client struct {
	conn   *agentConn
	api    agentpb.AgentClient
	opts   Options
	socket string
	segs   *segments
}

// Dial connects to the agent at socket (DefaultSocket, or $REWIND_SOCKET,
// when empty) and checks that it answers.
func Dial(ctx context.Context, socket string, opts ...Options) (*Client, error) {
	if socket == "" {
		socket = os.Getenv("REWIND_SOCKET")
	}
	if socket == "" {
		socket = DefaultSocket
	}
	o := DefaultOptions()
	if len(opts) > 0 {
		o = opts[0]
		if o.CallTimeout <= 0 {
			o.CallTimeout = DefaultOptions().CallTimeout
		}
	}
	token, err := jobToken(o)
	if err != nil {
		return nil, &Error{Op: "dial", Msg: err.Error(), kind: ErrInvalid}
	}
	// The node's agent, over its Unix socket: a local connection, no
	// TLS (transport).
	dopts := append([]grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxAnswer))}, tokenInterceptors(token)...)
	conn, err := dialAgent(socket, dopts)
	if err != nil {
		return nil, &Error{Op: "dial", Msg: err.Error(), kind: ErrNoAgent}
	}
	c := &Client{conn: conn, api: agentpb.NewAgentClient(conn), opts: o, socket: socket,
		segs: &segments{path: segsock.Path(socket), token: token}}
	if _, err := c.Status(ctx); err != nil {
		conn.close()
		return nil, &Error{Op: "dial", Msg: fmt.Sprintf("no agent answers on %s (is `rewind agent` running?): %v", socket, err), kind: ErrNoAgent}
	}
	return c, nil
}

// Close closes the connections.
func (c *Client) Close() error {
	c.segs.close()
	return c.conn.close()
}

// API returns the raw gRPC client, for operator tools.
func (c *Client) API() agentpb.AgentClient { return c.api }

// call bounds ctx by the call timeout.
func (c *Client) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.opts.CallTimeout)
}

// Status asks the agent about itself.
func (c *Client) Status(ctx context.Context) (*agentpb.StatusResponse, error) {
	ctx, cancel := c.call(ctx)
	defer cancel()
	st, err := c.api.Status(ctx, &agentpb.StatusRequest{})
	return st, wrap("status", err)
}

// List returns the shards the agent holds for job (every job when empty).
func (c *Client) List(ctx context.Context, job string) ([]*agentpb.Shard, error) {
	ctx, cancel := c.call(ctx)
	defer cancel()
	resp, err := c.api.List(ctx, &agentpb.ListRequest{Job: job})
	if err != nil {
		return nil, wrap("list", err)
	}
	return resp.Shards, nil
}

// Session returns a session for one rank of a job. job must be a valid job
// id (letters, digits, '.', '_', '-'), rank < worldSize.
func (c *Client) Session(job string, rank, worldSize uint32) (*Session, error) {
	if err := shm.ValidateJob(job); err != nil {
		return nil, &Error{Op: "session", Msg: err.Error(), kind: ErrInvalid}
	}
	if rank >= worldSize {
		return nil, &Error{Op: "session", Msg: fmt.Sprintf("rank %d out of range for world size %d", rank, worldSize), kind: ErrInvalid}
	}
	return &Session{c: c, job: job, rank: rank, worldSize: worldSize, maps: map[string]*segmentMap{}}, nil
}

// SessionFromEnv builds a session from the environment. The job is
// REWIND_JOB, or else the job id of the Kubernetes job named by
// REWIND_NAMESPACE and REWIND_JOB_NAME (shm.KubeJobID: NAMESPACE.NAME, as
// the controller registers it). Rank and world size are REWIND_RANK and
// REWIND_WORLD_SIZE, else Open MPI's OMPI_COMM_WORLD_RANK and
// OMPI_COMM_WORLD_SIZE (an MPIJob's ranks), else torchrun's RANK and
// WORLD_SIZE.
func (c *Client) SessionFromEnv() (*Session, error) {
	job := os.Getenv("REWIND_JOB")
	if job == "" {
		id, err := shm.KubeJobFromEnv(os.Getenv)
		if err != nil {
			return nil, &Error{Op: "session", Msg: err.Error(), kind: ErrInvalid}
		}
		job = id
	}
	rank, err1 := envUint("REWIND_RANK", "OMPI_COMM_WORLD_RANK", "RANK")
	ws, err2 := envUint("REWIND_WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "WORLD_SIZE")
	if job == "" || err1 != nil || err2 != nil {
		return nil, &Error{Op: "session", Msg: fmt.Sprintf("job/rank/world size not set in the environment (REWIND_JOB=%q or REWIND_NAMESPACE and REWIND_JOB_NAME, rank: %v, world size: %v)", job, err1, err2), kind: ErrInvalid}
	}
	return c.Session(job, rank, ws)
}

func envUint(names ...string) (uint32, error) {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			u, err := strconv.ParseUint(v, 10, 32)
			if err != nil {
				return 0, fmt.Errorf("%s=%q is not a number", n, v)
			}
			return uint32(u), nil
		}
	}
	return 0, fmt.Errorf("none of %v is set", names)
}
