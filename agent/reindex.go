package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"rewind.dev/rewind/internal/units"
	"rewind.dev/rewind/shm"
)

// reindex rebuilds the agent's index from what is under the shm root, so a
// restarted agent serves every checkpoint committed before it died. A slot
// recorded as committed is checked in full (header and every checksum); one
// that fails is kept as corrupt and never served. Slots that were being
// written are free again. Nothing on tmpfs is trusted without a check.
func (a *Agent) reindex() error {
	start := time.Now()
	jobs, err := a.cfg.FS.ReadDir(a.cfg.ShmRoot)
	if err != nil {
		return fmt.Errorf("agent: re-index: %w", err)
	}
	var shards, corrupt int
	for _, j := range jobs {
		if j.Name() == warmName || j.Name() == fillingName {
			a.leftWarm(j.Name())
			continue
		}
		if j.Name() == partialName {
			continue // partially open shards of a previous run (partial.go): removed
		}
		if !j.IsDir() || shm.ValidateJob(j.Name()) != nil {
			a.log.Warn("re-index: ignoring unexpected entry under shm root", "name", j.Name())
			continue
		}
		ranks, err := a.cfg.FS.ReadDir(filepath.Join(a.cfg.ShmRoot, j.Name()))
		if err != nil {
			return fmt.Errorf("agent: re-index: %w", err)
		}
		for _, rd := range ranks {
			n, ok := strings.CutPrefix(rd.Name(), "rank-")
			rank, err := strconv.ParseUint(n, 10, 32)
			if !ok || err != nil || !rd.IsDir() {
				a.log.Warn("re-index: ignoring unexpected entry", "job", j.Name(), "name", rd.Name())
				continue
			}
			s, c, err := a.reindexRank(j.Name(), uint32(rank))
			if err != nil {
				return err
			}
			shards, corrupt = shards+s, corrupt+c
		}
	}
	a.log.Info("re-indexed shared memory", "committed_shards", shards, "corrupt_shards", corrupt,
		"bytes", units.Bytes(a.used), "took", time.Since(start).Round(time.Millisecond))
	if a.used > a.budget {
		a.log.Warn("segments found exceed the budget: saves will fail until some are deleted",
			"used", units.Bytes(a.used), "budget", units.Bytes(a.budget))
	}
	for job, n := range a.jobUsed {
		if jb := a.cfg.JobBudgetBytes; jb > 0 && n > jb {
			a.log.Warn("a job's segments found exceed its share of the budget: its saves that need more room will fail until some are deleted",
				"job", job, "used", units.Bytes(n), "job_budget", units.Bytes(jb))
		}
	}
	return nil
}

// leftWarm deals with a warm segment (warm.go) that an agent which died
// left under the shm root: fillWarm reuses a ready one, once it has
// counted it against the budget (and removes it when there is no room);
// one whose allocation never finished, or that this agent does not keep
// (no warm segment configured), is removed, or its bytes would be held
// by no budget.
func (a *Agent) leftWarm(name string) {
	if name == warmName && a.cfg.WarmSegment > 0 {
		return
	}
	if err := a.cfg.FS.Remove(filepath.Join(a.cfg.ShmRoot, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		a.log.Warn("re-index: removing a warm segment left by the agent before", "name", name, "err", err)
	}
}

func (a *Agent) reindexRank(job string, rank uint32) (shards, corrupt int, err error) {
	r := a.rank(job, rank, true)
	var rec slotsFile
	if f, err := a.cfg.FS.OpenFile(a.paths.SlotsFile(job, rank), os.O_RDONLY, 0); err == nil {
		b, rerr := io.ReadAll(io.NewSectionReader(f, 0, 1<<24))
		f.Close()
		if rerr != nil || json.Unmarshal(b, &rec) != nil {
			a.log.Error("re-index: slot states unreadable; the rank's segments are treated as uncommitted", "job", job, "rank", rank)
			rec = slotsFile{}
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return 0, 0, fmt.Errorf("agent: re-index: %w", err)
	}
	known := map[uint32]*slot{}
	for _, s := range rec.Slots {
		known[s.Index] = s
	}
	entries, err := a.cfg.FS.ReadDir(a.paths.RankDir(job, rank))
	if err != nil {
		return 0, 0, fmt.Errorf("agent: re-index: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		if strings.HasSuffix(name, ".tmp") {
			_ = a.cfg.FS.Remove(filepath.Join(a.paths.RankDir(job, rank), name))
			continue
		}
		n, ok := strings.CutPrefix(strings.TrimSuffix(name, ".safetensors"), "slot-")
		idx, perr := strconv.ParseUint(n, 10, 32)
		if !ok || perr != nil || !strings.HasSuffix(name, ".safetensors") {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			return 0, 0, fmt.Errorf("agent: re-index: %w", err)
		}
		s := &slot{Index: uint32(idx), State: stateFree, Size: fi.Size()}
		if k := known[s.Index]; k != nil && (k.State == stateCommitted || k.State == stateCorrupt) {
			s = k
			leaves, err := a.checkSegment(job, rank, s)
			switch {
			case s.State == stateCorrupt:
				corrupt++
			case err != nil && !errors.Is(err, shm.ErrCorrupt):
				return 0, 0, fmt.Errorf("agent: re-index of job %s rank %d step %d: %w (not a checksum mismatch: fix and restart)", job, rank, s.Step, err)
			case err != nil:
				a.log.Error("re-index: checkpoint corrupt: it will not be served", "job", job, "rank", rank, "step", s.Step, "err", err)
				s.State, s.Problem = stateCorrupt, err.Error()
				corrupt++
			default:
				s.verified, s.leaves = true, leaves
				shards++
			}
			s.Size = fi.Size()
		}
		if s.Seq > a.seq {
			a.seq = s.Seq
		}
		a.used += uint64(fi.Size())
		a.jobUsed[job] += uint64(fi.Size())
		r.slots = append(r.slots, s)
	}
	if len(r.slots) > 0 {
		a.log.Info("re-index: rank", "job", job, "rank", rank, "slots", len(r.slots), "latest_step", latestStep(&r.rankState))
	}
	return shards, corrupt, a.persist(&r.rankState)
}

func latestStep(r *rankState) int64 {
	if l := r.latest(); l != nil {
		return l.Step
	}
	return -1
}
