package main

import (
	"os"
	"path/filepath"
)

// rewindBeside returns the path of the rewind binary in this binary's
// directory (make build puts both in bin/): the product whose agent and
// coordinator commands the harness runs as processes.
func rewindBeside() (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	return filepath.Join(filepath.Dir(self), "rewind"), nil
}
