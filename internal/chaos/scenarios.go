package chaos

import (
	"context"
	"fmt"
	"time"
)

// scenario is one fault story, played against a fresh cluster whose job
// is warm (a few steps in, durable copies on NVMe and S3).
type scenario struct {
	name  string
	what  string
	smoke bool // part of `make chaos-smoke`
	play  func(ctx context.Context, s *session) error
}

// progressSteps is how many steps the job must train after the last fault.
const progressSteps = 5

// scenarios are the chaos suite, in the order `make chaos` plays them.
var scenarios = []scenario{
	{"node-kill", "SIGKILL a node container running a rank (agent, ranks and shared memory die)", true, playNodeKill},
	{"node-pause", "freeze a rank's node (docker pause: a hung node), thaw it after the recovery", false, playNodePause},
	{"partition-heal", "disconnect a rank's node from the network, reconnect it after the recovery: its old rank must be fenced", false, playPartition},
	{"coordinator-partition", "cut the coordinator off from every node for 6 s, reconnect it: no node declared dead, no rank restarted", false, playCoordinatorPartition},
	{"minio-stop", "kill MinIO while uploads run, start it again 5 to 10 s later", true, playMinIOStop},
	{"nvme-full", "fill a rank's node's NVMe volume (ENOSPC), free it again", false, playNVMeFull},
	{"corrupt-replica", "hang a rank's node and corrupt the copies of its rank that the spare holds; the restore must fall back", false, playCorruptReplica},
	{"coordinator-commit", "the coordinator exits while recording a step consistent (fault coordinator/before-consistent), restarted", false, playCoordinatorKill},
	{"coordinator-kill-loop", "SIGKILL the coordinator 20 times during commits (at the commit path's fault points or at random), each time restarted", false, playCoordinatorKillLoop},
	{"coordinator-regang", "a rank's node killed, the coordinator exits in the middle of the recovery (fault coordinator/before-regang), restarted", false, playCoordinatorRegang},
	{"agent-transfer", "a rank's node exits after a tier upload, before its manifest (fault agent/tier-uploaded)", false, playAgentTransfer},
	{"restore-source-lost", "a rank's node killed, then, while its rank is restored, the node the restore reads from: the job must come back whole", false, playSourceLost},
	{"restore-source-hangs", "restore-source-lost with the second node frozen, not killed, and thawed after the recovery", false, playSourceHangs},
	{"rack-loss", "two rank nodes killed at once (a rack lost): the job must come back whole without both", false, playRackLoss},
	{"two-nodes", "two rank nodes killed one after the other, each recovered", false, playTwoNodes},
	{"all-copies-corrupt", "every copy of one rank at the newest step durable on S3 corrupt (its node killed with its memory and NVMe, its S3 copy and replicas corrupted, the coordinator frozen meanwhile): the job resumes whole at the step before", false, playAllCopiesCorrupt},
	{"hostile-client", "garbage on every daemon's TCP ports and adversarial gRPC calls while the job trains: training must not notice", false, playHostileClient},
}

// loseNode injects a fault that loses a rank's node, waits for the job's
// n-th recovery and for the job to train on.
func (s *session) loseNode(ctx context.Context, n int, what, victim string, do func(context.Context) error) (int, error) {
	i, err := s.inject(ctx, what, victim, true, do)
	if err != nil {
		return i, err
	}
	ev, err := s.waitRecovery(ctx, n, 90*time.Second)
	if err != nil {
		return i, err
	}
	return i, s.trainOn(ctx, ev.Step, progressSteps)
}

func playNodeKill(ctx context.Context, s *session) error {
	snap, err := s.snapshot(ctx)
	if err != nil {
		return err
	}
	victim := s.pick(rankNodes(snap))
	_, err = s.loseNode(ctx, 1, "kill "+victim, victim, func(ctx context.Context) error { return s.c.Kill(ctx, victim) })
	return err
}

func playNodePause(ctx context.Context, s *session) error {
	return s.loseAndReturn(ctx, "pause", func(ctx context.Context, v string) error { return s.c.Pause(ctx, v) },
		"unpause", func(ctx context.Context, v string) error { return s.c.Unpause(ctx, v) })
}

func playPartition(ctx context.Context, s *session) error {
	return s.loseAndReturn(ctx, "disconnect", func(ctx context.Context, v string) error { return s.c.Disconnect(ctx, v) },
		"reconnect", func(ctx context.Context, v string) error { return s.c.Connect(ctx, v) })
}

// loseAndReturn loses a rank's node without killing it, lets the job
// recover without it, then brings it back: its old ranks must be stopped
// and commit nothing, and the job must train on.
func (s *session) loseAndReturn(ctx context.Context, verb string, do func(context.Context, string) error,
	undoVerb string, undo func(context.Context, string) error) error {
	snap, err := s.snapshot(ctx)
	if err != nil {
		return err
	}
	victim := s.pick(rankNodes(snap))
	i, err := s.loseNode(ctx, 1, verb+" "+victim, victim, func(ctx context.Context) error { return do(ctx, victim) })
	if err != nil {
		return err
	}
	if err := s.heal(ctx, i, undoVerb+" "+victim, func(ctx context.Context) error { return undo(ctx, victim) }); err != nil {
		return err
	}
	// Long enough for the returned node's supervisor to notice its ranks
	// moved (a second or two), and for the job to go on past it.
	after, err := s.snapshot(ctx)
	if err != nil {
		return err
	}
	if err := s.trainOn(ctx, after.LatestConsistent(), progressSteps); err != nil {
		return err
	}
	s.mu.Lock()
	s.ev.Progress = progressSteps
	recoveries := len(s.ev.Recoveries)
	s.mu.Unlock()
	s.staleNode = victim
	// As the node comes back it may spread the deaths it declared of the
	// others while cut off; the coordinator must not believe them.
	c := Check{Name: "the return declared no live node dead", OK: recoveries == 1, Detail: fmt.Sprintf("%d recoveries", recoveries)}
	s.check(c)
	return nil
}

func playTwoNodes(ctx context.Context, s *session) error {
	snap, err := s.snapshot(ctx)
	if err != nil {
		return err
	}
	first := s.pick(rankNodes(snap))
	if _, err := s.loseNode(ctx, 1, "kill "+first, first, func(ctx context.Context) error { return s.c.Kill(ctx, first) }); err != nil {
		return err
	}
	if snap, err = s.snapshot(ctx); err != nil {
		return err
	}
	var left []string
	for _, n := range rankNodes(snap) {
		if n != first {
			left = append(left, n)
		}
	}
	second := s.pick(left)
	if second == "" {
		return fmt.Errorf("chaos: no rank node left to kill after %s (placement %v)", first, snap.Placement())
	}
	_, err = s.loseNode(ctx, 2, "kill "+second, second, func(ctx context.Context) error { return s.c.Kill(ctx, second) })
	return err
}
