package chaos

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/clock"
	"rewind.dev/rewind/internal/demo"
	"rewind.dev/rewind/transport"
)

// The daemons' TCP ports inside the cluster (deploy/compose).
const (
	coordGRPCPort   = 7400
	coordGossipPort = 7947
	agentGRPCPort   = 7070
	agentGossipPort = 7946
	metricsPort     = 9464
)

// hostileFor is how long the hostile client attacks: some 30 steps.
const hostileFor = 8 * time.Second

// playHostileClient: while the job trains, a client that lies and
// babbles talks to every daemon: raw garbage on every TCP port
// (coordinator's gRPC, gossip and metrics; every agent's gRPC/data,
// gossip and metrics), and well-formed gRPC calls that must be refused
// (absurd world sizes, replicas, huge segments, steps that cannot be)
// or are read-only (other jobs' names, the job's steps, negative steps).
// Training must not notice: no failed save, no recovery, no rank
// restarted, its step rate within half of its pace; every daemon stays
// up; every call that must be refused is.
func playHostileClient(ctx context.Context, s *session) error {
	before, err := s.snapshot(ctx)
	if err != nil {
		return err
	}
	from := before.LatestConsistent()
	seed := s.rng.Uint64()
	var refused, garbage Check
	i, err := s.inject(ctx, fmt.Sprintf("hostile client against every daemon for %v", hostileFor), "", false, func(ctx context.Context) error {
		actx, cancel := context.WithTimeout(ctx, hostileFor)
		defer cancel()
		var wg sync.WaitGroup
		targets := s.hostileTargets()
		took := make([]int, len(targets))
		for k, addr := range targets {
			r := rand.New(rand.NewPCG(seed, uint64(k)))
			wg.Go(func() { took[k] = babble(actx, addr, r) })
		}
		refused = s.adversarialCalls(actx)
		wg.Wait()
		garbage = garbageTaken(targets, took)
		return nil
	})
	if err != nil {
		return err
	}
	start := s.ev.Faults[i].At
	after, err := s.snapshot(ctx)
	if err != nil {
		return fmt.Errorf("chaos: the coordinator after the hostile client: %w", err)
	}
	s.check(refused)
	s.check(garbage)
	s.check(stepRate(from, after.LatestConsistent(), after.At.Sub(start), s.cfg.StepTime))
	s.check(s.daemonsUp(ctx))
	s.check(s.noFailedSaves(ctx, start))
	return s.trainOn(ctx, after.LatestConsistent(), progressSteps)
}

// hostileTargets returns every TCP port of every rewind daemon.
func (s *session) hostileTargets() []string {
	var out []string
	for _, p := range []int{coordGRPCPort, coordGossipPort, metricsPort} {
		out = append(out, net.JoinHostPort(s.c.addr(svcCoordinator), fmt.Sprint(p)))
	}
	for _, n := range nodeServices {
		for _, p := range []int{agentGRPCPort, agentGossipPort, metricsPort} {
			out = append(out, net.JoinHostPort(s.c.addr(n), fmt.Sprint(p)))
		}
	}
	return out
}

// garbage openings: random bytes, an HTTP/2 preface followed by random
// frames, an HTTP request with a lying length, a TLS hello to a
// plaintext port.
var openings = [][]byte{
	nil,
	[]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
	[]byte("POST /debug/faults HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n"),
	{0x16, 0x03, 0x01, 0xff, 0xff, 0x01, 0x00, 0xff, 0xfb},
}

// babble opens connections to addr one after another until ctx ends,
// each writing an opening and up to 64 KiB of random bytes; it returns
// how many connections the port took.
func babble(ctx context.Context, addr string, r *rand.Rand) (took int) {
	var d net.Dialer
	for n := 0; n < 200 && ctx.Err() == nil; n++ {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		conn, err := d.DialContext(cctx, "tcp", addr)
		cancel()
		if err != nil {
			// Refused: the port is not up yet, or gone (judged later).
			_ = clock.Sleep(ctx, 50*time.Millisecond)
			continue
		}
		_ = conn.SetDeadline(time.Now().Add(500 * time.Millisecond))
		buf := make([]byte, r.IntN(64<<10))
		for j := range buf {
			buf[j] = byte(r.Uint32())
		}
		took++
		_, _ = conn.Write(append(openings[r.IntN(len(openings))], buf...))
		_, _ = conn.Read(make([]byte, 512))
		_ = conn.Close()
	}
	return took
}

// garbageTaken checks that every port took garbage: a port that could
// not be reached was not attacked.
func garbageTaken(targets []string, took []int) Check {
	c := Check{Name: "every daemon's every port took garbage", OK: true}
	total := 0
	for k, n := range took {
		total += n
		if n == 0 {
			c.OK = false
			c.Detail = fmt.Sprintf("%s took no connection", targets[k])
			return c
		}
	}
	c.Detail = fmt.Sprintf("%d connections of garbage to %d ports", total, len(targets))
	return c
}

// callTimeout bounds each adversarial call: what is judged is that the
// daemon answers, not how fast, and a TLS handshake on a loaded machine
// under a flood of garbage can take seconds.
const callTimeout = 5 * time.Second

// quickRedial redials within a second of a failed connection (a
// handshake that timed out under the flood), not after grpc's backoff of
// up to two minutes, during which every call would fail unanswered.
var quickRedial = grpc.WithConnectParams(grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
	MinConnectTimeout: callTimeout,
})

// call is one adversarial call; refuse says it must fail.
type call struct {
	what   string
	refuse bool
	do     func(context.Context) error
}

// callOn is a call and the connection it goes over.
type callOn struct {
	call
	conn *grpc.ClientConn
}

func on(conn *grpc.ClientConn, calls []call) []callOn {
	out := make([]callOn, len(calls))
	for i, cl := range calls {
		out[i] = callOn{cl, conn}
	}
	return out
}

// failed describes a call that failed the check: what it got, after how
// long, and the state of its connection then.
func (cl callOn) failed(got string, took time.Duration) string {
	s := fmt.Sprintf("%s: %s (after %v", cl.what, got, took.Round(time.Millisecond))
	if cl.conn != nil {
		s += ", connection " + strings.ToLower(cl.conn.GetState().String())
	}
	return s + ")"
}

// adversarialCalls makes well-formed calls that must be refused or are
// read-only, against the coordinator and every agent, in rounds until
// ctx ends, and checks that each one that must be refused was.
func (s *session) adversarialCalls(ctx context.Context) Check {
	c := Check{Name: "every call that must be refused was, every daemon answered"}
	calls := on(s.c.conn, s.coordinatorCalls())
	reader, rconn, err := s.readerCalls()
	if err != nil {
		c.Detail = err.Error()
		return c
	}
	defer rconn.Close()
	calls = append(calls, on(rconn, reader)...)
	for _, n := range nodeServices {
		conn, err := s.c.sec.NewClient(net.JoinHostPort(s.c.addr(n), fmt.Sprint(agentGRPCPort)), transport.ExpectNode(n), quickRedial)
		if err != nil {
			c.Detail = fmt.Sprintf("dialing %s: %v", n, err)
			return c
		}
		defer conn.Close()
		calls = append(calls, on(conn, agentCalls(n, agentpb.NewAgentClient(conn), s.cfg.Job))...)
	}
	made, bad := callRounds(ctx, calls)
	c.OK = len(bad) == 0 && made > 0
	c.Detail = fmt.Sprintf("%d calls of %d kinds", made, len(calls))
	if len(bad) > 0 {
		c.Detail = strings.Join(bad, "; ")
	}
	return c
}

// callRounds makes the calls in rounds (50 at most) while ctx lasts and
// returns how many it made and what each one that failed the check got.
// A call has callTimeout of its own, even past ctx's end: under load the
// timer that ends a context with a deadline can fire long after the
// deadline, and a call started meanwhile would see its time gone before
// it began (gRPC fails a call whose deadline has passed at once, with
// DeadlineExceeded) while ctx still said it lasted.
func callRounds(ctx context.Context, calls []callOn) (made int, bad []string) {
	end, bounded := ctx.Deadline()
	lasts := func() bool { return ctx.Err() == nil && (!bounded || time.Now().Before(end)) }
	for round := 0; round < 50 && lasts(); round++ {
		for _, cl := range calls {
			if !lasts() {
				break
			}
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), callTimeout)
			began := time.Now()
			err := cl.do(cctx)
			took := time.Since(began)
			cancel()
			made++
			switch {
			case cl.refuse && err == nil:
				bad = append(bad, cl.failed("accepted", took))
			case cl.refuse && (status.Code(err) == codes.Unavailable || status.Code(err) == codes.DeadlineExceeded):
				bad = append(bad, cl.failed("not answered: "+err.Error(), took))
			case !cl.refuse && err != nil:
				bad = append(bad, cl.failed(err.Error(), took))
			}
		}
		if len(bad) > 0 {
			break
		}
	}
	return made, bad
}

func (s *session) coordinatorCalls() []call {
	api, job := s.c.API, s.cfg.Job
	huge, replicas := uint32(math.MaxUint32), uint32(99)
	return []call{
		{"coordinator RegisterJob of another job with world size 2^32-1", true, func(ctx context.Context) error {
			_, err := api.RegisterJob(ctx, &coordpb.RegisterJobRequest{Job: "hostile-huge", WorldSize: huge})
			return err
		}},
		{"coordinator RegisterJob of the job with 99 replicas", true, func(ctx context.Context) error {
			_, err := api.RegisterJob(ctx, &coordpb.RegisterJobRequest{Job: job, WorldSize: s.cfg.WorldSize, Replicas: &replicas})
			return err
		}},
		{"coordinator RegisterJob of the job with a policy of garbage", true, func(ctx context.Context) error {
			_, err := api.RegisterJob(ctx, &coordpb.RegisterJobRequest{Job: job, WorldSize: s.cfg.WorldSize, Policy: ";;;\x00nvme:every=-1"})
			return err
		}},
		{"coordinator InspectStep of a negative step", true, func(ctx context.Context) error {
			_, err := api.InspectStep(ctx, &coordpb.InspectStepRequest{Job: job, Step: -7})
			return err
		}},
		{"coordinator InspectStep of another job", true, func(ctx context.Context) error {
			_, err := api.InspectStep(ctx, &coordpb.InspectStepRequest{Job: "hostile-none", Step: 1})
			return err
		}},
		{"coordinator Latest of the job", false, func(ctx context.Context) error {
			_, err := api.Latest(ctx, &coordpb.LatestRequest{Job: job})
			return err
		}},
		{"coordinator ListSteps of the job", false, func(ctx context.Context) error {
			_, err := api.ListSteps(ctx, &coordpb.ListStepsRequest{Job: job})
			return err
		}},
		{"coordinator PlanRestore dry run of a step that cannot be", true, func(ctx context.Context) error {
			_, err := api.PlanRestore(ctx, &coordpb.PlanRestoreRequest{Job: job, Step: math.MaxInt64, DryRun: true})
			return err
		}},
		{"coordinator PlanRestore dry run of the newest step", false, func(ctx context.Context) error {
			_, err := api.PlanRestore(ctx, &coordpb.PlanRestoreRequest{Job: job, Step: -1, DryRun: true, RequestedBy: "hostile"})
			return err
		}},
	}
}

// readerCalls are the state-changing calls a reader's certificate makes:
// each must be refused (PermissionDenied) and change nothing.
func (s *session) readerCalls() ([]call, *grpc.ClientConn, error) {
	sec, err := transport.Load(filepath.Join(s.c.Certs, "reader"), nil)
	if err != nil {
		return nil, nil, fmt.Errorf("chaos: the reader's certificate: %w", err)
	}
	conn, err := sec.NewClient(net.JoinHostPort("127.0.0.1", strconv.Itoa(s.c.Ports.Coord)), transport.ExpectCoordinator, quickRedial)
	if err != nil {
		return nil, nil, fmt.Errorf("chaos: dialing the coordinator as a reader: %w", err)
	}
	api, job := coordpb.NewCoordinatorClient(conn), s.cfg.Job
	return []call{
		{"a reader's DeleteStep of the newest step, forced", true, func(ctx context.Context) error {
			l, err := api.Latest(ctx, &coordpb.LatestRequest{Job: job})
			if err != nil {
				return err
			}
			_, err = api.DeleteStep(ctx, &coordpb.DeleteStepRequest{Job: job, Step: l.GetStep(), Force: true})
			return err
		}},
		{"a reader's NodeDown of a rank's node", true, func(ctx context.Context) error {
			_, err := api.NodeDown(ctx, &coordpb.NodeDownRequest{Node: nodeServices[0], Reason: "hostile reader"})
			return err
		}},
		{"a reader's RegisterJob of the job", true, func(ctx context.Context) error {
			_, err := api.RegisterJob(ctx, &coordpb.RegisterJobRequest{Job: job, WorldSize: s.cfg.WorldSize + 1})
			return err
		}},
		{"a reader's ListSteps of the job", false, func(ctx context.Context) error {
			_, err := api.ListSteps(ctx, &coordpb.ListStepsRequest{Job: job})
			return err
		}},
	}, conn, nil
}

func agentCalls(node string, a agentpb.AgentClient, job string) []call {
	return []call{
		{node + " Prepare of another job's 4 EiB segment", true, func(ctx context.Context) error {
			_, err := a.Prepare(ctx, &agentpb.PrepareRequest{Job: "hostile", Rank: 0, WorldSize: 1, Step: 1, SizeBytes: 1 << 62})
			return err
		}},
		{node + " Prepare of a rank beyond the world", true, func(ctx context.Context) error {
			_, err := a.Prepare(ctx, &agentpb.PrepareRequest{Job: "hostile", Rank: 7, WorldSize: 2, Step: 1, SizeBytes: 4096})
			return err
		}},
		{node + " Read of a negative step", true, func(ctx context.Context) error {
			st, err := a.Read(ctx, &agentpb.ReadRequest{Job: job, Rank: 0, Step: -3})
			if err == nil {
				_, err = st.Recv()
			}
			return err
		}},
		{node + " List of the job", false, func(ctx context.Context) error {
			_, err := a.List(ctx, &agentpb.ListRequest{Job: job})
			return err
		}},
		{node + " Status", false, func(ctx context.Context) error {
			_, err := a.Status(ctx, &agentpb.StatusRequest{})
			return err
		}},
	}
}

// stepRate checks that the job kept at least half its pace.
func stepRate(from, to int64, d, stepTime time.Duration) Check {
	c := Check{Name: "training kept its pace"}
	want := d.Seconds() / stepTime.Seconds() / 2
	c.OK = float64(to-from) >= want
	c.Detail = fmt.Sprintf("steps %d to %d in %.1f s (at least %.0f wanted)", from, to, d.Seconds(), want)
	return c
}

// daemonsUp checks that the coordinator and every node container still
// run.
func (s *session) daemonsUp(ctx context.Context) Check {
	c := Check{Name: "every daemon stayed up", OK: true}
	for _, svc := range append([]string{svcCoordinator}, nodeServices...) {
		running, _, code, err := s.c.Running(ctx, svc)
		if err != nil || !running {
			c.OK = false
			c.Detail = fmt.Sprintf("%s: running %v, exit code %d, %v", svc, running, code, orOK(err))
			return c
		}
	}
	c.Detail = fmt.Sprintf("the coordinator and %d nodes run", len(nodeServices))
	return c
}

// noFailedSaves checks that no rank reported a failed save since from.
func (s *session) noFailedSaves(ctx context.Context, from time.Time) Check {
	c := Check{Name: "no save failed"}
	saves := 0
	for _, n := range nodeServices {
		stdout, _, err := s.c.Logs(ctx, n)
		if err != nil {
			c.Detail = err.Error()
			return c
		}
		for _, l := range events(ParseLogs(n, stdout)) {
			if l.At.Before(from) {
				continue
			}
			switch l.Event.Kind {
			case demo.KindSaveFailed:
				c.Detail = fmt.Sprintf("%s rank %d: step %d: %s", n, l.Rank, l.Event.Step, l.Event.Err)
				return c
			case demo.KindSaved:
				saves++
			}
		}
	}
	c.OK = saves > 0
	c.Detail = fmt.Sprintf("%d saves since the attack began, none failed", saves)
	return c
}
