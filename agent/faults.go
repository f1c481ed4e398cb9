package agent

import (
	"fmt"
	"os"

	"rewind.dev/rewind/faultinject"
	"rewind.dev/rewind/shm"
)

// The agent's fault points (faultinject.Points) are asked at these places:
//
//	agent/shard-copied           Commit, before anything is recorded
//	agent/committed-unreported   Commit, recorded but not yet reported
//	agent/replica-received       receiveShard (the first bytes arrived) and checkReceived (all of them), before they are checked
//	agent/replica-stored         copyFromPeer, a replica committed but not reported
//	agent/tier-uploaded          push, a shard uploaded before its manifest
//	agent/tier-manifest-written  transfer, a manifest written before the report
//	agent/restore-fetched        fetchSource, a restore source about to be used
//
// and the shared-memory file system is wrapped (Config.Validate).

// corruptShard flips one bit of the shard held in b inside a tensor, where
// its checksums must notice, and returns the byte's offset.
func corruptShard(b []byte, f faultinject.Fault) (int64, error) {
	h, err := shm.DecodeBytes(b)
	if err != nil {
		return 0, err
	}
	for _, t := range h.Tensors {
		if t.End > t.Begin {
			off := h.DataStart + t.Begin
			return off + int64(faultinject.Flip(b[off:h.DataStart+t.End], f)), nil
		}
	}
	return 0, fmt.Errorf("agent: shard of %s rank %d step %d has no tensor bytes to corrupt", h.Meta.Job, h.Meta.Rank, h.Meta.Step)
}

// corruptSegment flips a bit of the committed shard in the segment at path
// (size bytes) in place: memory gone bad under a committed checkpoint.
func (a *Agent) corruptSegment(path string, size int64, f faultinject.Fault) {
	file, err := a.cfg.FS.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		a.log.Error("fault: cannot open the segment to corrupt", "path", path, "err", err)
		return
	}
	m, err := shm.Map(file, size, true)
	file.Close()
	if err != nil {
		a.log.Error("fault: cannot map the segment to corrupt", "path", path, "err", err)
		return
	}
	defer m.Close()
	off, err := corruptShard(m.Data[:size], f)
	if err != nil {
		a.log.Error("fault: cannot corrupt the segment", "path", path, "err", err)
		return
	}
	a.log.Warn("fault: flipped a bit of a committed shard", "point", f.Point, "path", path, "offset", off)
}
