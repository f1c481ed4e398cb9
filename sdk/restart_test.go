package sdk_test

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/sdk"
)

// stillDown stands in for an agent that is down, on its socket: it
// accepts and drops every connection, counting them, so a test knows how
// many times a client tried to reconnect meanwhile. It is closed and its
// socket removed by the returned function.
func stillDown(t *testing.T, socket string) (attempts *atomic.Int64, up func()) {
	t.Helper()
	if err := os.Remove(socket); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	attempts = new(atomic.Int64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			attempts.Add(1)
			c.Close()
		}
	}()
	return attempts, func() {
		l.Close()
		<-done
		_ = os.Remove(socket)
	}
}

// A rank's client outlives an agent that was down for a while (its
// supervisor restarting it, a re-index of a full node): once the agent
// answers again, the rank's next save goes through on the same client and
// session. gRPC's own reconnect backoff grows to 120 s, so a client left
// to it failed every save for seconds to minutes after the agent was back.
func TestSaveOnSameClientAfterAgentOutage(t *testing.T) {
	spec, agentProc, s := spawnAndSave(t, "outage")
	ctx := ctxT(t)
	agentProc.Kill()
	attempts, up := stillDown(t, spec.Socket)
	// The training loop saves on while the agent is away: every save fails
	// as "no agent", and the client's connection is retried meanwhile.
	wait.ForNil(t, time.Minute, "five reconnection attempts while the agent is down", func() error {
		if err := s.Save(ctx, 3, state(3), nil); !errors.Is(err, sdk.ErrNoAgent) {
			t.Fatalf("save while the agent is down: %v, want ErrNoAgent", err)
		}
		if n := attempts.Load(); n < 5 {
			return fmt.Errorf("%d attempts so far", n)
		}
		return nil
	})
	up()
	agentProc = testcluster.SpawnAgent(t, spec) // returns once a new client is answered
	if err := s.Save(ctx, 3, state(3), nil); err != nil {
		t.Fatalf("first save on the same client once the agent is back: %v", err)
	}
	mustRestoreState(t, s, 3, state(3))
	// Killed and restarted between two saves, with no call in between:
	// the next save finds the new agent.
	agentProc.Kill()
	testcluster.SpawnAgent(t, spec)
	if err := s.Save(ctx, 4, state(4), nil); err != nil {
		t.Fatalf("first save on the same client after an agent restart between saves: %v", err)
	}
	mustRestoreState(t, s, 4, state(4))
	older, err := s.RestoreStep(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	same(t, state(3), older)
}

// spawnAndSave starts an agent process, dials it (calls time out after
// 5 s), and saves steps 1 and 2 of job's rank 0 through a session it
// returns, with the agent's spec and process.
func spawnAndSave(t *testing.T, job string) (testcluster.AgentProcess, *testcluster.Proc, *sdk.Session) {
	t.Helper()
	cfg := testcluster.AgentConfig(t)
	spec := testcluster.AgentProcess{Node: "child", ShmRoot: cfg.ShmRoot, Socket: cfg.Socket}
	proc := testcluster.SpawnAgent(t, spec)
	c := testcluster.Dial(t, cfg.Socket, sdk.Options{CallTimeout: 5 * time.Second})
	s := session(t, c, job, 0, 1)
	for step := int64(1); step <= 2; step++ {
		if err := s.Save(ctxT(t), step, state(step), nil); err != nil {
			t.Fatal(err)
		}
	}
	return spec, proc, s
}
