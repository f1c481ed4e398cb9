package bench

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// placement is where the CPU test's S3 rows run their parts when the
// benchmark started the S3 server itself on this machine: the loop's
// thread alone on one CPU, the server's threads on the others. In production the
// object store is on other machines; a server sharing the loop's core
// would measure what the server costs, not what the transfer costs the
// node. The transfer (the benchmark's own threads other than the loop's,
// standing in for the agent) stays free to run on every CPU, the loop's
// included: its cost is what the figure measures.
type placement struct {
	loopCPU   int
	serverPID int
	server    unix.CPUSet // the CPUs the server is confined to
	all       unix.CPUSet // the process's CPUs before the test
}

// String says where everything runs, for the printed note.
func (p *placement) String() string {
	if p == nil {
		return ""
	}
	return fmt.Sprintf("s3 rows: the loop's thread on CPU %d, the local MinIO (pid %d) on CPU %s, the transfer on any CPU",
		p.loopCPU, p.serverPID, cpuList(p.server))
}

// placeLocalServer plans the placement for the MinIO server the benchmark
// started (process pid); nil, with no error, when this machine has a
// single CPU to give.
func placeLocalServer(pid int) (*placement, error) {
	var all unix.CPUSet
	if err := unix.SchedGetaffinity(0, &all); err != nil {
		return nil, fmt.Errorf("bench: cpu affinity: %w", err)
	}
	if all.Count() < 2 {
		return nil, nil
	}
	p := &placement{serverPID: pid, all: all, loopCPU: -1}
	for cpu := range maxCPUs {
		switch {
		case !all.IsSet(cpu):
		case p.loopCPU < 0:
			p.loopCPU = cpu
		default:
			p.server.Set(cpu)
		}
	}
	return p, nil
}

// apply confines the loop's thread to loopCPU and every thread of the
// server to the other CPUs; threads the server starts later inherit it
// from the thread that starts them.
func (p *placement) apply(loopTID int) error {
	var loop unix.CPUSet
	loop.Set(p.loopCPU)
	if err := unix.SchedSetaffinity(loopTID, &loop); err != nil {
		return fmt.Errorf("bench: pinning the loop to CPU %d: %w", p.loopCPU, err)
	}
	return setProcessAffinity(p.serverPID, &p.server)
}

// undo gives the loop and the server every CPU back.
func (p *placement) undo(loopTID int) error {
	if err := unix.SchedSetaffinity(loopTID, &p.all); err != nil {
		return fmt.Errorf("bench: unpinning the loop: %w", err)
	}
	return setProcessAffinity(p.serverPID, &p.all)
}

// maxCPUs is how many CPUs a unix.CPUSet holds.
const maxCPUs = 1024

func setProcessAffinity(pid int, set *unix.CPUSet) error {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return fmt.Errorf("bench: threads of pid %d: %w", pid, err)
	}
	var errs []error
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, set); err != nil && !errors.Is(err, unix.ESRCH) { // ESRCH: the thread ended
			errs = append(errs, fmt.Errorf("thread %d: %w", tid, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("bench: affinity of pid %d: %w", pid, err)
	}
	return nil
}

// cpuList formats a CPU set as "1" or "1,2,3".
func cpuList(set unix.CPUSet) string {
	var cpus []string
	for cpu := range maxCPUs {
		if set.IsSet(cpu) {
			cpus = append(cpus, strconv.Itoa(cpu))
		}
	}
	return strings.Join(cpus, ",")
}
