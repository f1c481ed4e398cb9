package agent

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"rewind.dev/rewind/internal/units"
	"rewind.dev/rewind/shm"
)

// preflight checks the shared-memory root before the agent serves anything:
// it must be memory-backed, and the budget must fit in it and in the host's
// memory. It logs what it found, and a misconfiguration is an error here,
// never a SIGBUS in a training process later.
func (a *Agent) preflight() error {
	root := a.cfg.ShmRoot
	if err := a.cfg.FS.MkdirAll(root, a.segs.FileMode|0o700); err != nil {
		return fmt.Errorf("agent: pre-flight: cannot create shm root %s: %w", root, err)
	}
	if err := a.privateRoot(); err != nil {
		return err
	}
	st, err := a.cfg.FS.Statfs(root)
	if err != nil {
		return fmt.Errorf("agent: pre-flight: %w", err)
	}
	a.fsStat = st
	memTotal := memTotalBytes()
	a.log.Info("pre-flight", "shm_root", root, "filesystem", st.Type, "size", units.Bytes(st.Size),
		"free", units.Bytes(st.Free), "budget", units.Bytes(a.cfg.BudgetBytes), "mem_total", units.Bytes(memTotal))
	if !st.Tmpfs {
		return fmt.Errorf("agent: pre-flight: shm root %s is on %s, not tmpfs: checkpoints would go to disk at disk speed; mount a tmpfs there or use /dev/shm", root, st.Type)
	}
	a.budget = a.cfg.BudgetBytes
	if a.budget == 0 {
		a.budget = defaultBudget(st.Size, memTotal)
		a.log.Info("budget by default", "budget", units.Bytes(a.budget), "tmpfs", units.Bytes(st.Size), "mem_total", units.Bytes(memTotal))
	}
	if a.budget > st.Size {
		return fmt.Errorf("agent: pre-flight: budget %s exceeds the %s tmpfs at %s; lower --budget or enlarge the tmpfs",
			units.Bytes(a.budget), units.Bytes(st.Size), root)
	}
	if memTotal > 0 && a.budget > memTotal {
		return fmt.Errorf("agent: pre-flight: budget %s exceeds the host's memory %s", units.Bytes(a.budget), units.Bytes(memTotal))
	}
	if a.budget < 2*shm.Alignment {
		return fmt.Errorf("agent: pre-flight: budget %s cannot hold even one shard", units.Bytes(a.budget))
	}
	return nil
}

// privateRoot makes the shm root the agent's alone (mode 0700), and
// refuses a root another user owns: whoever owns it could reach every
// job's segments. Directories and segments under it are created 0700 and
// 0600; ones an older agent made more open are out of reach through the
// root.
func (a *Agent) privateRoot() error {
	root := a.cfg.ShmRoot
	fi, err := os.Stat(root)
	if err != nil {
		return fmt.Errorf("agent: pre-flight: %w", err)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("agent: pre-flight: shm root %s belongs to uid %d and the agent runs as uid %d: that user could reach every job's checkpoints; chown it to the agent's user or choose another --shm-root",
			root, st.Uid, os.Geteuid())
	}
	if fi.Mode().Perm() != 0o700 {
		if err := os.Chmod(root, 0o700); err != nil {
			return fmt.Errorf("agent: pre-flight: making shm root %s private: %w", root, err)
		}
		a.log.Info("shm root made private to the agent", "shm_root", root, "was", fi.Mode().Perm().String())
	}
	return nil
}

// defaultBudget is the budget with no --budget: the tmpfs's size, but at
// most half the host's memory (a tmpfs may be sized beyond the memory
// behind it, a container's /dev/shm sized to the node, and the training
// processes need the rest). memTotal 0 (unknown) leaves the tmpfs size.
func defaultBudget(tmpfs, memTotal uint64) uint64 {
	if memTotal > 0 && tmpfs > memTotal/2 {
		return memTotal / 2
	}
	return tmpfs
}

// memTotalBytes reads MemTotal from /proc/meminfo, or 0 if it cannot.
func memTotalBytes() uint64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}
