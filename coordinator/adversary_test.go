package coordinator_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/clock"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/transport"
)

// The tests here are a compromised node's: an attacker with node-a's own
// certificate (not the shared node/* one) calls the coordinator by hand,
// with well-formed requests that lie, against a job that runs on node-b
// only. A node may speak for itself (threat model); none of these calls
// may act on node-b's job.

const victim = "victim"

// dialNode is a client of the coordinator at addr with node's own
// certificate.
func dialNode(t *testing.T, addr, node string) coordpb.CoordinatorClient {
	t.Helper()
	return testcluster.DialCoordinatorAs(t, addr, transport.Identity{Role: transport.RoleNode, Name: node})
}

func registerNode(t *testing.T, c coordpb.CoordinatorClient, node string, inv []*coordpb.ShardRecord, pins []*coordpb.Pin) {
	t.Helper()
	req := &coordpb.RegisterRequest{Node: &coordpb.Node{Name: node, Addr: "127.0.0.1:1"}, Inventory: inv, Pins: pins}
	if _, err := c.Register(ctxT(t), req); err != nil {
		t.Fatalf("%s registers: %v", node, err)
	}
}

// victimRuns registers the victim job, its one rank on node-b, and has
// node-b commit its step 1 at epoch 1.
func victimRuns(t *testing.T, a, b coordpb.CoordinatorClient) {
	t.Helper()
	registerNode(t, b, "node-b", nil, nil)
	registerNode(t, a, "node-a", nil, nil)
	if _, err := b.RegisterJob(ctxT(t), &coordpb.RegisterJobRequest{Job: victim, WorldSize: 1, Placement: map[uint32]string{0: "node-b"}, Epoch: 1}); err != nil {
		t.Fatal(err)
	}
	commitVictim(t, b, 1, 1)
}

// commitVictim has node-b commit step of the victim's rank 0 at epoch,
// and checks that it is the job's latest step then.
func commitVictim(t *testing.T, b coordpb.CoordinatorClient, step int64, epoch uint64) {
	t.Helper()
	rec := victimShard("node-b", step)
	rec.Epoch = epoch
	if _, err := b.Report(ctxT(t), &coordpb.ReportRequest{Node: "node-b", Shards: []*coordpb.ShardRecord{rec}}); err != nil {
		t.Fatalf("node-b's rank commits step %d at epoch %d: %v", step, epoch, err)
	}
	if l, err := b.Latest(ctxT(t), &coordpb.LatestRequest{Job: victim}); err != nil || l.Step != step {
		t.Fatalf("latest after node-b committed step %d: %v %v", step, l, err)
	}
}

func victimShard(node string, step int64) *coordpb.ShardRecord {
	return &coordpb.ShardRecord{Job: victim, Step: step, Rank: 0, WorldSize: 1, Node: node, SizeBytes: 4096,
		HeaderChecksum: "crc32c:00000000", State: coordpb.CopyState_COPY_STATE_COMMITTED}
}

// startOnFakeClock starts a coordinator on a fake clock: a test steps it
// past the coordinator's catching up with the agents.
func startOnFakeClock(t *testing.T) (*testcluster.Coordinator, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(time.Now())
	cfg := testcluster.CoordinatorConfig(t)
	cfg.Clock = clk
	return testcluster.StartCoordinator(t, cfg), clk
}

func wantVictimEpoch(t *testing.T, c coordpb.CoordinatorClient, epoch uint64, when string) {
	t.Helper()
	l, err := c.Latest(ctxT(t), &coordpb.LatestRequest{Job: victim})
	if err != nil || l.Epoch != epoch {
		t.Fatalf("%s: the victim's epoch is %v (%v), want %d", when, l.GetEpoch(), err, epoch)
	}
}

// TestNodeCannotFenceAnotherJob: an agent registering names the epochs it
// knows, and a coordinator whose index is behind adopts them (fencing).
// node-a names a far newer epoch of node-b's job: had it been adopted,
// node-b's rank would be fenced (its saves refused, its agent deleting
// its steps past the epoch's start). It is not, while the coordinator
// catches up (node-a takes no part in the job) nor after (node-a forges
// a copy of the job to take part); node-b's own agent is still believed
// while the coordinator catches up, and its rank saves on.
func TestNodeCannotFenceAnotherJob(t *testing.T) {
	c, clk := startOnFakeClock(t)
	a, b := dialNode(t, c.Addr, "node-a"), dialNode(t, c.Addr, "node-b")
	victimRuns(t, a, b)

	forged := []*coordpb.Pin{{Job: victim, Step: 1, Protected: -1, Epoch: 1 << 40, EpochStep: 0}}
	registerNode(t, a, "node-a", nil, forged)
	wantVictimEpoch(t, b, 1, "node-a named a newer epoch while the coordinator catches up")

	held := victimShard("node-b", 1)
	held.Epoch = 1
	registerNode(t, b, "node-b", []*coordpb.ShardRecord{held}, []*coordpb.Pin{{Job: victim, Step: 1, Protected: -1, Epoch: 2, EpochStep: 1}})
	wantVictimEpoch(t, b, 2, "node-b's agent named epoch 2 while the coordinator catches up")

	clk.Step(time.Hour) // the coordinator has caught up
	registerNode(t, a, "node-a", []*coordpb.ShardRecord{victimShard("node-a", 1)}, forged)
	wantVictimEpoch(t, b, 2, "node-a forged a copy of the job and named a newer epoch")
	commitVictim(t, b, 2, 2)
}

// TestNodeCannotRestartAnotherJob: an agent's order stream names the
// gangs it holds broken, and a coordinator that knows no recovery of such
// a job finishes it by restarting the job (a predecessor died in the
// middle). node-a names node-b's job: nothing is restarted or aborted,
// the job keeps its epoch, and the claim is dropped once the agents had
// their grace. A claim naming more jobs than the coordinator may hold is
// refused outright.
func TestNodeCannotRestartAnotherJob(t *testing.T) {
	logs := &testcluster.Logs{}
	cfg := testcluster.CoordinatorConfig(t)
	cfg.Logger, cfg.LeaveGrace, cfg.MaxJobs = logs.Logger(slog.LevelWarn), time.Second, 16
	c := testcluster.StartCoordinator(t, cfg)
	a, b := dialNode(t, c.Addr, "node-a"), dialNode(t, c.Addr, "node-b")
	victimRuns(t, a, b)

	const restarting = "finishing a recovery the previous coordinator left unfinished"
	ctx := ctxT(t)
	bs, err := b.Transfers(ctx, &coordpb.TransfersRequest{Node: "node-b"})
	if err != nil {
		t.Fatal(err)
	}
	gang := make(chan *coordpb.TransferOrder, 16)
	go func() {
		for {
			o, err := bs.Recv()
			if err != nil {
				return
			}
			if o.Job == victim && (o.GetAbort() != nil || o.GetResume() != nil) {
				gang <- o
			}
		}
	}()

	many := map[string]int64{}
	for i := range cfg.MaxJobs + 1 {
		many[fmt.Sprintf("job-%d", i)] = 1
	}
	if _, err := recvOrder(a, &coordpb.TransfersRequest{Node: "node-a", BrokenGangs: many}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("node-a names %d broken gangs: %v, want InvalidArgument", len(many), err)
	}

	as, err := a.Transfers(ctx, &coordpb.TransfersRequest{Node: "node-a", BrokenGangs: map[string]int64{victim: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer as.CloseSend()
	wait.For(t, 5*time.Second, "the coordinator drops node-a's claim that the victim's gang is broken, or acts on it", func() bool {
		return len(gang) > 0 || logs.Has(restarting, "job="+victim) || logs.Has("takes no part in a job holds its gang broken", "job="+victim, "node=node-a")
	})
	if logs.Has(restarting, "job="+victim) {
		t.Fatalf("the coordinator restarts the victim on node-a's word:\n%s", logs)
	}
	select {
	case o := <-gang:
		t.Fatalf("node-b was sent %v for the victim on node-a's word", o)
	default:
	}
	wantVictimEpoch(t, b, 1, "node-a named the victim's gang broken")
	commitVictim(t, b, 2, 1)
}

// recvOrder opens an order stream with req and returns its first message
// or error.
func recvOrder(c coordpb.CoordinatorClient, req *coordpb.TransfersRequest) (*coordpb.TransferOrder, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := c.Transfers(ctx, req)
	if err != nil {
		return nil, err
	}
	return s.Recv()
}
