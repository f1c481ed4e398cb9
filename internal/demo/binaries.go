package demo

import (
	"fmt"
	"os"
	"path/filepath"
)

// binaries returns the two binaries the demo's processes run: exe, whose
// demo-train command is a rank (rewind-dev; empty: this process's own
// executable), and rewind, whose agent and coordinator commands are the
// cluster (empty: the rewind binary in exe's directory, where make build
// puts both).
func binaries(exe, rewind string) (string, string, error) {
	if exe == "" {
		e, err := os.Executable()
		if err != nil {
			return "", "", fmt.Errorf("demo: finding the rewind-dev binary: %w", err)
		}
		exe = e
	}
	if rewind == "" {
		rewind = filepath.Join(filepath.Dir(exe), "rewind")
	}
	if _, err := os.Stat(rewind); err != nil {
		return "", "", fmt.Errorf("demo: the rewind binary that runs the agents and the coordinator: %w (make build puts it beside rewind-dev)", err)
	}
	return exe, rewind, nil
}
