package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"rewind.dev/rewind/api/coordpb"
)

// A rank that restores a step its node's memory does not hold — it
// started before a restore placed its shard here (Kubernetes recreates a
// gang's pods where the scheduler likes, and the controller restores onto
// them once they are placed), or on a node nobody chose — does not find
// nothing: the agent asks the coordinator where the rank's shard of that
// step lives (RankSources, cheapest first for this node) and fetches it
// as a restore does, verified, falling back on any error. A restore
// running at the same time for the same shard is not repeated: the copy
// is taken under the rank's copy lock and skipped once the shard is here.

// pullTimeout bounds an on-demand pull: the SDK call's own deadline
// applies too.
const pullTimeout = 10 * time.Minute

// openOrPull is Open, fetching the shard first when the node lacks it and
// a coordinator knows where it is. latest Opens never pull: without a
// coordinator's step, there is nothing to ask for.
func (a *Agent) openOrPull(ctx context.Context, job string, rank uint32, step int64, latest bool) (*shardInfo, uint64, error) {
	sh, lease, err := a.Open(job, rank, step, latest)
	if err == nil || latest || a.rep == nil || !errors.Is(err, ErrNotFound) {
		return sh, lease, err
	}
	if perr := a.pull(ctx, job, rank, step); perr != nil {
		return nil, 0, fmt.Errorf("%w (and fetching it: %v)", err, perr)
	}
	return a.Open(job, rank, step, false)
}

// pull fetches rank's shard of step into this node's memory from the
// sources the coordinator names.
func (a *Agent) pull(ctx context.Context, job string, rank uint32, step int64) error {
	ctx, cancel := context.WithTimeout(ctx, pullTimeout)
	defer cancel()
	src, err := a.rep.c.RankSources(ctx, &coordpb.RankSourcesRequest{Job: job, Step: step, Rank: rank, Node: a.cfg.Node})
	if err != nil {
		return fmt.Errorf("agent: asking the coordinator where job %s rank %d step %d is: %w", job, rank, step, err)
	}
	ps := PeerShard{Job: job, Rank: rank, WorldSize: src.WorldSize, Step: step, Size: int64(src.SizeBytes), HeaderSum: src.HeaderChecksum}
	var sources []Source
	for _, s := range src.Sources {
		sources = append(sources, Source{Tier: s.Tier, Node: s.Node, Addr: s.Addr})
	}
	t0 := time.Now()
	res, err := a.FetchFrom(ctx, ps, sources)
	if err != nil {
		return err
	}
	a.log.Info("shard fetched on demand for a restoring rank", "job", job, "rank", rank, "step", step,
		"source", res.Tier, "failed_before", len(res.Failed), "ms", time.Since(t0).Milliseconds())
	return nil
}
