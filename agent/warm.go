package agent

import (
	"os"
	"path/filepath"
	"sync"

	"rewind.dev/rewind/shm"
)

// A warm segment is shared memory allocated, zeroed and mapped ahead of
// need (Config.WarmSegment). A node that takes over a rank from a dead one
// would otherwise pay for all of that inside the restore, which costs more
// than moving the bytes: the first save or restore of a rank on the node
// adopts the warm segment instead (renamed into the rank's slot, truncated
// to the shard's size), and a new one is made in the background once the
// copy into it is done.
//
// The segment is made under fillingName and renamed to warmName only once
// it is mapped and faulted in, in the same critical section that makes it
// adoptable: a file named warmName is always a segment a restore would
// take, so whoever watches the shm root (a test, an operator) sees the
// moment it is ready, not the moment its allocation began.
type warm struct {
	mu      sync.Mutex
	m       *shm.Mapping // nil while none is ready
	path    string       // where it lies while ready
	filling bool         // a new one is being made (without mu held)
	// adopted maps a slot path to the mapping of the warm segment renamed
	// there, for the copy about to fill it.
	adopted map[string]*shm.Mapping
}

const (
	warmName    = ".warm"         // a warm segment ready to adopt
	fillingName = ".warm.filling" // one being allocated and faulted in
)

// fillWarm makes the warm segment, if configured and none is ready or
// being made. The lock is not held while the memory is allocated and
// faulted in (up to seconds), so a restore looking for a warm segment
// meanwhile goes on without one at once.
func (a *Agent) fillWarm() {
	size := a.cfg.WarmSegment
	if size <= 0 {
		return
	}
	a.warm.mu.Lock()
	if a.warm.m != nil || a.warm.filling {
		a.warm.mu.Unlock()
		return
	}
	a.warm.filling = true
	a.warm.mu.Unlock()
	path, filling := filepath.Join(a.cfg.ShmRoot, warmName), filepath.Join(a.cfg.ShmRoot, fillingName)
	// A warm segment left by an agent that died is reused (Reserve keeps a
	// file of the right size), not allocated beside it.
	_ = a.cfg.FS.Rename(path, filling)
	m := a.makeWarm(filling, size)
	a.warm.mu.Lock()
	defer a.warm.mu.Unlock()
	a.warm.filling = false
	if m == nil {
		// Nothing counts it against the budget: what Reserve made, or
		// what a dead agent left, goes.
		_ = a.cfg.FS.Remove(filling)
		return
	}
	if err := a.cfg.FS.Rename(filling, path); err != nil {
		a.log.Warn("no warm segment", "err", err)
		m.Close()
		_ = a.cfg.FS.Remove(filling)
		a.releaseBudget(warmName, 0, size)
		return
	}
	a.warm.m, a.warm.path = m, path
	a.log.Info("warm segment ready", "bytes", size)
}

// makeWarm allocates and maps the warm segment at path, or returns nil.
func (a *Agent) makeWarm(path string, size int64) *shm.Mapping {
	if err := a.reserveBudget(warmName, 0, 0, size); err != nil {
		a.log.Warn("no warm segment: the budget has no room for it", "bytes", size, "err", err)
		return nil
	}
	if _, err := a.segs.Reserve(path, size); err != nil {
		a.releaseBudget(warmName, 0, size)
		a.log.Warn("no warm segment", "err", err)
		return nil
	}
	f, err := a.cfg.FS.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		a.releaseBudget(warmName, 0, size)
		return nil
	}
	m, err := shm.Map(f, size, true)
	f.Close()
	if err != nil {
		a.releaseBudget(warmName, 0, size)
		a.log.Warn("no warm segment", "err", err)
		return nil
	}
	return m
}

// adoptWarm renames the warm segment to path for a new slot of size bytes,
// if one is ready and large enough; the slot's budget is then reserved as
// for any new segment. The caller holds the rank's lock, and starts
// fillWarm once its copy is done: a new warm segment made during the copy
// would take the memory bandwidth and the CPU the copy needs.
func (a *Agent) adoptWarm(path string, size int64) bool {
	a.warm.mu.Lock()
	defer a.warm.mu.Unlock()
	if a.warm.m == nil || size > int64(len(a.warm.m.Data)) {
		return false
	}
	if err := a.cfg.FS.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return false
	}
	if err := a.cfg.FS.Rename(a.warm.path, path); err != nil {
		a.log.Warn("adopting the warm segment", "err", err)
		return false
	}
	a.adjustUsed(warmName, -int64(len(a.warm.m.Data)))
	if a.warm.adopted == nil {
		a.warm.adopted = map[string]*shm.Mapping{}
	}
	a.warm.adopted[path] = a.warm.m
	a.warm.m = nil
	return true
}

// unadoptWarm undoes adoptWarm for a slot whose save the budget refused:
// the segment at path is the warm one again, counted as such, or, if
// another is ready or being made, it goes.
func (a *Agent) unadoptWarm(path string) {
	a.warm.mu.Lock()
	defer a.warm.mu.Unlock()
	m := a.warm.adopted[path]
	delete(a.warm.adopted, path)
	if m == nil {
		return
	}
	if a.warm.m == nil && !a.warm.filling && a.cfg.FS.Rename(path, a.warm.path) == nil {
		a.warm.m = m
		a.adjustUsed(warmName, int64(len(m.Data)))
		return
	}
	m.Close()
	if err := a.cfg.FS.Remove(path); err != nil && !os.IsNotExist(err) {
		a.log.Warn("removing a warm segment a refused save had adopted", "path", path, "err", err)
	}
}

// warmMapping returns, once, the mapping of a warm segment adopted at
// path (the first size bytes are the slot), or nil.
func (a *Agent) warmMapping(path string) *shm.Mapping {
	a.warm.mu.Lock()
	defer a.warm.mu.Unlock()
	m := a.warm.adopted[path]
	delete(a.warm.adopted, path)
	return m
}
