package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"

	"rewind.dev/rewind/internal/bench"
	"rewind.dev/rewind/internal/units"
	"rewind.dev/rewind/shm"
)

func runBench(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "save" {
		return fmt.Errorf("usage: rewind bench save [flags]")
	}
	fs := flag.NewFlagSet("bench save", flag.ContinueOnError)
	sizes := fs.String("sizes", "1GiB,4GiB", "comma-separated state sizes per rank")
	runs := fs.Int("runs", 5, "measured runs per figure (the median is printed)")
	tensors := fs.Int("tensors", 64, "number of tensors the state is split into")
	workers := fs.Int("workers", 0, "copy/checksum goroutines (0: default)")
	shmDir := fs.String("shm-dir", "/dev/shm", "tmpfs to put the benchmark's segments in")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	cfg := bench.SaveConfig{Runs: *runs, Tensors: *tensors, Workers: *workers, ShmDir: *shmDir, Out: os.Stdout}
	for _, s := range strings.Split(*sizes, ",") {
		b, err := units.ParseBytes(s)
		if err != nil {
			return err
		}
		cfg.Sizes = append(cfg.Sizes, b)
	}
	if cfg.Workers == 0 {
		cfg.Workers = shm.DefaultWorkers()
	}
	fmt.Printf("rewind bench save: %d runs per figure (median), %d tensors, %d copy workers\n", cfg.Runs, cfg.Tensors, cfg.Workers)
	rs, err := bench.Save(ctx, cfg)
	bench.PrintSave(os.Stdout, rs, cfg.Workers)
	return err
}
