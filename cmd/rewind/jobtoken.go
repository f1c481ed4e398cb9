package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"rewind.dev/rewind/internal/jobtoken"
	"rewind.dev/rewind/shm"
)

// runJobToken is `rewind job-token`: a new job key file (--new), or the
// token of a job under a key file, for whoever launches a job's ranks
// (a script, a scheduler's prolog) to hand them as $REWIND_JOB_TOKEN.
func runJobToken(_ context.Context, args []string) error {
	fs := newFlagSet("job-token", "job-token --key FILE (--new | JOB)",
		"Prints JOB's token under the key file that the agents' --job-key names, or writes a new key file with --new.")
	key := fs.String("key", "", "the job key file (required)")
	create := fs.Bool("new", false, "write a new key file at --key (refused if it exists), readable by its owner only")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *key == "" {
		return usageError(fs, errors.New("--key is required"))
	}
	if *create {
		if fs.NArg() != 0 {
			return usageError(fs, errors.New("--new takes no job"))
		}
		return jobtoken.WriteFile(*key)
	}
	if fs.NArg() != 1 {
		return usageError(fs, errors.New("name one job"))
	}
	job := fs.Arg(0)
	if err := shm.ValidateJob(job); err != nil {
		return err
	}
	keys, err := jobtoken.Load(*key)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(os.Stdout, keys.Token(job))
	return err
}
