package agent_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/internal/segsock"
	"rewind.dev/rewind/internal/testcluster"
)

// agentCall is one method of the agent's gRPC service: its request type
// and how to call it through a client.
type agentCall struct {
	name string
	req  func() proto.Message
	call func(ctx context.Context, c agentpb.AgentClient, m proto.Message) error
}

func agentUnary[Req proto.Message, Resp any](name string, newReq func() Req, h func(agentpb.AgentClient, context.Context, Req) (Resp, error)) agentCall {
	return agentCall{name: name, req: func() proto.Message { return newReq() },
		call: func(ctx context.Context, c agentpb.AgentClient, m proto.Message) error {
			_, err := h(c, ctx, m.(Req))
			return err
		}}
}

// agentCalls are the agent's methods but Fetch and TierCopies: Fetch dials
// the addresses its request names, which a fuzzer must not make it do
// beyond loopback, and TierCopies lists durable tiers, which this agent
// has none of.
var agentCalls = []agentCall{
	agentUnary("Prepare", func() *agentpb.PrepareRequest { return &agentpb.PrepareRequest{} }, wrap(agentpb.AgentClient.Prepare)),
	agentUnary("Commit", func() *agentpb.CommitRequest { return &agentpb.CommitRequest{} }, wrap(agentpb.AgentClient.Commit)),
	agentUnary("Open", func() *agentpb.OpenRequest { return &agentpb.OpenRequest{} }, wrap(agentpb.AgentClient.Open)),
	agentUnary("Release", func() *agentpb.ReleaseRequest { return &agentpb.ReleaseRequest{} }, wrap(agentpb.AgentClient.Release)),
	agentUnary("List", func() *agentpb.ListRequest { return &agentpb.ListRequest{} }, wrap(agentpb.AgentClient.List)),
	agentUnary("Verify", func() *agentpb.VerifyRequest { return &agentpb.VerifyRequest{} }, wrap(agentpb.AgentClient.Verify)),
	agentUnary("ReportCorrupt", func() *agentpb.VerifyRequest { return &agentpb.VerifyRequest{} }, wrap(agentpb.AgentClient.ReportCorrupt)),
	agentUnary("Delete", func() *agentpb.DeleteRequest { return &agentpb.DeleteRequest{} }, wrap(agentpb.AgentClient.Delete)),
	agentUnary("Status", func() *agentpb.StatusRequest { return &agentpb.StatusRequest{} }, wrap(agentpb.AgentClient.Status)),
	agentUnary("Consistent", func() *agentpb.ConsistentRequest { return &agentpb.ConsistentRequest{} }, wrap(agentpb.AgentClient.Consistent)),
	{name: "Read", req: func() proto.Message { return &agentpb.ReadRequest{} },
		call: func(ctx context.Context, c agentpb.AgentClient, m proto.Message) error {
			s, err := c.Read(ctx, m.(*agentpb.ReadRequest))
			if err != nil {
				return err
			}
			for range 64 { // a shard of the seeded job is a few messages
				if _, err := s.Recv(); err != nil {
					if err == io.EOF {
						return nil
					}
					return err
				}
			}
			return nil
		}},
}

// wrap drops a generated client method's call options.
func wrap[Req, Resp any](m func(agentpb.AgentClient, context.Context, Req, ...grpc.CallOption) (Resp, error)) func(agentpb.AgentClient, context.Context, Req) (Resp, error) {
	return func(c agentpb.AgentClient, ctx context.Context, r Req) (Resp, error) { return m(c, ctx, r) }
}

// clearAgentCodes are the codes a refused request may carry.
var clearAgentCodes = []codes.Code{codes.InvalidArgument, codes.NotFound, codes.FailedPrecondition,
	codes.AlreadyExists, codes.OutOfRange, codes.ResourceExhausted, codes.Aborted, codes.Unavailable,
	codes.DeadlineExceeded, codes.Canceled, codes.PermissionDenied, codes.DataLoss}

// fuzzAgent starts an agent with TCP on loopback holding job keep's
// ranks 0 and 1 at steps 1 and 2. Its TCP port is plaintext, so that the
// fuzzer's bytes reach the data protocol itself (with TLS they are the
// same bytes inside the session).
func fuzzAgent(f *testing.F) *testcluster.Agent {
	cfg := testcluster.AgentConfig(f)
	cfg.ListenAddr, cfg.Logger, cfg.Transport = "127.0.0.1:0", testcluster.Discard(), nil
	r := testcluster.StartAgent(f, cfg)
	c := testcluster.Dial(f, cfg.Socket)
	for rank := range uint32(2) {
		s, err := c.Session("keep", rank, 2)
		if err != nil {
			f.Fatal(err)
		}
		for step := int64(1); step <= 2; step++ {
			if err := s.Save(context.Background(), step, stateOf(rank, step), map[string]int{"step": int(step)}); err != nil {
				f.Fatal(err)
			}
		}
	}
	return r
}

// agentPrint is what the agent holds, in words: its shards and the
// memory they use.
func agentPrint(a *agent.Agent) string {
	var lines []string
	for _, sh := range a.List("") {
		lines = append(lines, fmt.Sprintf("%s/%d/%d %s %d %s", sh.Job, sh.Rank, sh.Step, sh.State, sh.Size, sh.HeaderSum))
	}
	slices.Sort(lines)
	used, _ := a.Used()
	return fmt.Sprintf("%s; used %d", strings.Join(lines, ", "), used)
}

// FuzzAgentRequests sends any request to any method of an agent that holds
// two committed steps of a job, through its gRPC socket. Whatever the
// bytes, the call returns within its deadline, the agent keeps serving,
// a refusal carries a clear status code, and a refused request changes
// nothing the agent holds.
func FuzzAgentRequests(f *testing.F) {
	seeds := []proto.Message{
		&agentpb.PrepareRequest{Job: "keep", Rank: 0, WorldSize: 2, Step: 3, SizeBytes: 4096},
		&agentpb.CommitRequest{Job: "keep", Rank: 0, Step: 3},
		&agentpb.OpenRequest{Job: "keep", Rank: 1, Step: 1},
		&agentpb.ReleaseRequest{Lease: 1},
		&agentpb.ListRequest{Job: "keep"},
		&agentpb.VerifyRequest{Job: "keep", Rank: 0, Step: 2},
		&agentpb.VerifyRequest{Job: "keep", Rank: 0, Step: 1},
		&agentpb.DeleteRequest{Job: "keep", Rank: 1, Step: 1},
		&agentpb.StatusRequest{},
		&agentpb.ConsistentRequest{Job: "keep"},
		&agentpb.ReadRequest{Job: "keep", Rank: 0, Step: 2},
	}
	for i, m := range seeds {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(byte(i), b)
	}
	r := fuzzAgent(f)
	api := testcluster.Dial(f, r.Config.Socket).API()
	f.Fuzz(func(t *testing.T, method byte, body []byte) {
		ac := agentCalls[int(method)%len(agentCalls)]
		req := ac.req()
		if err := proto.Unmarshal(body, req); err != nil {
			return
		}
		before := agentPrint(r.Agent)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err := ac.call(ctx, api, req)
		if _, serr := api.Status(context.Background(), &agentpb.StatusRequest{}); serr != nil {
			t.Fatalf("after %s(%v): the agent no longer answers Status: %v", ac.name, req, serr)
		}
		if err == nil {
			return
		}
		if st, ok := status.FromError(err); !ok || !slices.Contains(clearAgentCodes, st.Code()) {
			t.Fatalf("%s(%v) refused with %v: not a clear status", ac.name, req, err)
		}
		if after := agentPrint(r.Agent); after != before {
			t.Fatalf("%s(%v) was refused (%v) but changed what the agent holds:\nbefore %s\nafter  %s", ac.name, req, err, before, after)
		}
	})
}

// FuzzPeerDataRequest writes any bytes to an agent's TCP port, as a peer
// asking for a shard on the data path would: the agent answers or hangs
// up within its deadline, keeps serving, and what it holds is unchanged.
func FuzzPeerDataRequest(f *testing.F) {
	req := func(body string) []byte {
		b := append([]byte("RWND"), 0, 0, 0, 0)
		binary.BigEndian.PutUint32(b[4:], uint32(len(body)))
		return append(b, body...)
	}
	for _, s := range [][]byte{
		req(`{"job":"keep","rank":0,"step":2}`),
		append(req(`{"job":"keep","rank":1,"step":1}`), 0),
		append(req(`{"job":"keep","rank":1,"step":1}`), 1),
		req(`{"job":"../keep","rank":0,"step":2}`),
		req(`{"job":"keep","rank":4294967295,"step":-1}`),
		[]byte("RWND\xff\xff\xff\xff"),
		[]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
	} {
		f.Add(s)
	}
	r := fuzzAgent(f)
	api := testcluster.Dial(f, r.Config.Socket).API()
	f.Fuzz(func(t *testing.T, in []byte) {
		before := agentPrint(r.Agent)
		c, err := net.DialTimeout("tcp", r.Addrs.TCP, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(15 * time.Second))
		if _, err := c.Write(in); err != nil {
			return // the agent hung up already: a refusal
		}
		_ = c.(*net.TCPConn).CloseWrite()
		// The agent answers, or waits for the rest of a request until its
		// own deadline, and hangs up: either way the read ends.
		if _, err := io.Copy(io.Discard, c); err != nil && !isClosed(err) {
			t.Fatalf("reading the agent's answer to %q: %v", in, err)
		}
		if _, err := api.Status(context.Background(), &agentpb.StatusRequest{}); err != nil {
			t.Fatalf("after %q on the data port: the agent no longer answers Status: %v", in, err)
		}
		if after := agentPrint(r.Agent); after != before {
			t.Fatalf("%q on the data port changed what the agent holds:\nbefore %s\nafter  %s", in, before, after)
		}
	})
}

// isClosed reports whether err is the peer hanging up.
func isClosed(err error) bool {
	return strings.Contains(err.Error(), "connection reset") || strings.Contains(err.Error(), "broken pipe")
}

// FuzzPeerDataAnswer has a fake holder answer a receiving agent's request
// for a shard with any bytes: the receiver copies the shard only when the
// bytes are the real shard's, and otherwise refuses with an error and
// holds no committed copy of the step.
func FuzzPeerDataAnswer(f *testing.F) {
	holder := fuzzAgent(f)
	ps := agent.PeerShard{Job: "keep", Rank: 0, WorldSize: 2, Step: 2, Node: "holder"}
	for _, sh := range holder.Agent.List("keep") {
		if sh.Rank == 0 && sh.Step == 2 {
			ps.Size, ps.HeaderSum = sh.Size, sh.HeaderSum
		}
	}
	shard := readShard(f, holder, ps)
	good := append([]byte{0}, binary.BigEndian.AppendUint64(nil, uint64(len(shard)))...)
	good = append(good, shard...)
	f.Add(good)
	f.Add(good[:len(good)-1])
	flipped := bytes.Clone(good)
	flipped[len(flipped)-1] ^= 1
	f.Add(flipped)
	f.Add([]byte("\x01\x00\x00\x00\x05nope!"))
	cfg := testcluster.AgentConfig(f)
	cfg.Node, cfg.ListenAddr, cfg.Logger, cfg.Transport = "receiver", "127.0.0.1:0", testcluster.Discard(), nil
	receiver := testcluster.StartAgent(f, cfg)
	f.Fuzz(func(t *testing.T, answer []byte) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		go fakeHolder(l, answer)
		p := ps
		p.Addr = l.Addr().String()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		n, err := receiver.Agent.CopyFromPeer(ctx, p, nil)
		got := false
		var states []string
		for _, sh := range receiver.Agent.List("keep") {
			// A refused copy may leave its slot writing, for the next
			// copy or save to reuse; never committed.
			got = got || (sh.Rank == 0 && sh.Step == 2 && sh.State == "committed")
			states = append(states, fmt.Sprintf("%d/%d:%s", sh.Rank, sh.Step, sh.State))
		}
		real := bytes.Equal(answer, good) || (len(answer) > len(good) && bytes.Equal(answer[:len(good)], good))
		switch {
		case err != nil && bytes.Equal(answer, good):
			t.Fatalf("the real shard refused: %v", err)
		case err == nil && !real:
			t.Fatalf("a copy of %d bytes accepted from an answer that is not the shard (%d bytes)", n, len(answer))
		case err == nil && !got:
			t.Fatal("a copy accepted but not listed")
		case err != nil && got:
			t.Fatalf("a refused copy (%v) left a shard listed: %v", err, states)
		}
		if got {
			if _, _, err := receiver.Agent.Delete("keep", 0, true, -1); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// fakeHolder answers every connection on l with answer, whatever it
// asks, then hangs up: the data path's request, and the gRPC Read the
// receiver falls back to when the data path fails.
func fakeHolder(l net.Listener, answer []byte) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			var hdr [8]byte
			if _, err := io.ReadFull(c, hdr[:]); err != nil {
				return
			}
			if string(hdr[:4]) == "RWND" {
				if _, err := io.CopyN(io.Discard, c, int64(min(binary.BigEndian.Uint32(hdr[4:]), 4096))); err != nil {
					return
				}
			}
			_, _ = c.Write(answer)
		}()
	}
}

// readShard returns a shard's bytes as the holder sends them on the data
// path.
func readShard(tb testing.TB, holder *testcluster.Agent, ps agent.PeerShard) []byte {
	c, err := net.Dial("tcp", holder.Addrs.TCP)
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close()
	body := fmt.Sprintf(`{"job":%q,"rank":%d,"step":%d}`, ps.Job, ps.Rank, ps.Step)
	req := append([]byte("RWND"), binary.BigEndian.AppendUint32(nil, uint32(len(body)))...)
	if _, err := c.Write(append(req, body...)); err != nil {
		tb.Fatal(err)
	}
	var head [9]byte
	if _, err := io.ReadFull(c, head[:]); err != nil || head[0] != 0 {
		tb.Fatalf("holder's answer %v: %v", head, err)
	}
	shard := make([]byte, binary.BigEndian.Uint64(head[1:]))
	if _, err := io.ReadFull(c, shard); err != nil {
		tb.Fatal(err)
	}
	_, _ = c.Write([]byte{0}) // accepted
	return shard
}

// FuzzSegmentRequest sends the segment socket any packet: the agent
// answers with a refusal (no descriptor: a grant needs a save's token or
// a lease, which no input here holds) or hangs up, keeps serving, and
// holds what it held.
func FuzzSegmentRequest(f *testing.F) {
	for _, m := range []*agentpb.SegmentRequest{
		{Job: "keep", Rank: 0, Slot: 0, Grant: &agentpb.SegmentRequest_Lease{Lease: 1}},
		{Job: "keep", Rank: 1, Slot: 1, Grant: &agentpb.SegmentRequest_SaveToken{SaveToken: 7}},
		{Job: "keep", Rank: 0, Slot: 9},
		{Job: "../keep", Rank: 4294967295, JobToken: "rwj1.x"},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0xff, 0xff, 0xff})
	r := fuzzAgent(f)
	api := testcluster.Dial(f, r.Config.Socket).API()
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) == 0 || len(in) > segsock.MaxPacket {
			return // not a packet of this wire (empty is a hang-up)
		}
		before := agentPrint(r.Agent)
		c, err := net.DialTimeout(segsock.Network, segsock.Path(r.Config.Socket), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		uc := c.(*net.UnixConn)
		_ = uc.SetDeadline(time.Now().Add(15 * time.Second))
		if _, err := uc.Write(in); err != nil {
			return // the agent hung up already
		}
		var resp agentpb.SegmentResponse
		files, err := segsock.Read(uc, &resp)
		for _, f := range files {
			f.Close()
		}
		if err == nil && (resp.Code == 0 || len(files) != 0) {
			t.Fatalf("%q on the segment socket was granted: %+v, %d descriptors", in, &resp, len(files))
		}
		if _, err := api.Status(context.Background(), &agentpb.StatusRequest{}); err != nil {
			t.Fatalf("after %q on the segment socket: the agent no longer answers Status: %v", in, err)
		}
		if after := agentPrint(r.Agent); after != before {
			t.Fatalf("%q on the segment socket changed what the agent holds:\nbefore %s\nafter  %s", in, before, after)
		}
	})
}
