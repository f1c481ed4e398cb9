package shm

import (
	"fmt"
	"path/filepath"
	"strconv"
)

// MaxJobLen bounds a job id; it becomes a directory name.
const MaxJobLen = 128

// ValidateJob checks that a job id is safe as one path element: 1 to 128
// characters from [A-Za-z0-9._-], starting with a letter or digit (so never
// "." or ".."), and no path separator.
func ValidateJob(job string) error {
	if job == "" {
		return fmt.Errorf("shm: job id is empty")
	}
	if len(job) > MaxJobLen {
		return fmt.Errorf("shm: job id %.20q... is %d characters, the limit is %d", job, len(job), MaxJobLen)
	}
	for i := 0; i < len(job); i++ {
		c := job[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if i == 0 && !alnum {
			return fmt.Errorf("shm: job id %q must start with a letter or digit", job)
		}
		if !alnum && c != '.' && c != '_' && c != '-' {
			return fmt.Errorf("shm: job id %q contains %q; allowed are letters, digits, '.', '_' and '-'", job, c)
		}
	}
	return nil
}

// Paths names the files under a shared-memory root:
//
//	<root>/<job>/rank-<r>/slot-<i>.safetensors   a segment
//	<root>/<job>/rank-<r>/slots.json             the rank's slot states
type Paths struct{ Root string }

// RankDir returns the directory of one rank of a job.
func (p Paths) RankDir(job string, rank uint32) string {
	return filepath.Join(p.Root, job, "rank-"+strconv.FormatUint(uint64(rank), 10))
}

// Segment returns the path of a slot's segment.
func (p Paths) Segment(job string, rank, slot uint32) string {
	return filepath.Join(p.RankDir(job, rank), "slot-"+strconv.FormatUint(uint64(slot), 10)+".safetensors")
}

// SlotsFile returns the path of a rank's slot state file.
func (p Paths) SlotsFile(job string, rank uint32) string {
	return filepath.Join(p.RankDir(job, rank), "slots.json")
}
