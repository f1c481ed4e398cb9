package faultinject

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// EnvHits names a directory where every process records the fault points
// it fired, one empty file per point. `make test` sets it for the whole
// run and then checks that every point in Points was fired by some test
// (TestEveryPointFired): a point added to the table and never exercised
// fails the build.
const EnvHits = "REWIND_FAULT_HITS"

var recorded sync.Map // point → struct{}: recorded by this process

// recordHit notes point in the EnvHits directory once per process.
func recordHit(point string) {
	dir := os.Getenv(EnvHits)
	if dir == "" {
		return
	}
	if _, done := recorded.LoadOrStore(point, struct{}{}); done {
		return
	}
	f, err := os.OpenFile(filepath.Join(dir, hitFile(point)), os.O_CREATE|os.O_WRONLY, 0o644)
	if err == nil {
		f.Close()
	}
}

// hitFile is the file name that records point.
func hitFile(point string) string { return strings.ReplaceAll(point, "/", "_") }
