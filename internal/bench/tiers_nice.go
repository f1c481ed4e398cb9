package bench

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// setNiceExcept gives every thread of this process but keep (the loop's)
// the nice value nice: the benchmark's stand-in for an agent process run
// under `nice -n N` beside a training process at nice 0. Linux keeps a
// nice value per thread and a new thread takes its creator's, so the
// threads the Go runtime starts later take it too (the loop's locked
// thread starts none: the runtime starts threads for a locked one from a
// template thread). Raising a nice value needs no privilege; lowering it
// back needs CAP_SYS_NICE, so callers raise it once, last.
func setNiceExcept(keep, nice int) error {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return fmt.Errorf("bench: threads: %w", err)
	}
	var errs []error
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil || tid == keep {
			continue
		}
		if err := unix.Setpriority(unix.PRIO_PROCESS, tid, nice); err != nil && !errors.Is(err, unix.ESRCH) { // ESRCH: the thread ended
			errs = append(errs, fmt.Errorf("thread %d: %w", tid, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("bench: nice %d: %w", nice, err)
	}
	return nil
}
