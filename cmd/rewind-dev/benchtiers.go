package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"rewind.dev/rewind/internal/bench"
	"rewind.dev/rewind/internal/units"
	"rewind.dev/rewind/tiers"
)

func benchTiers(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench tiers", flag.ContinueOnError)
	dir := fs.String("dir", "/var/tmp", "directory on the disk to measure (the NVMe tier's disk); a local MinIO keeps its data here too")
	shmDir := fs.String("shm-dir", "/dev/shm", "tmpfs for the CPU test's segment")
	size := fs.String("size", "1GiB", "bytes per write of the NVMe and S3 throughput figures")
	cpuSize := fs.String("cpu-size", "4GiB", "bytes of the segment transferred beside the CPU-bound loop (0: no CPU test)")
	bandwidth := fs.String("bandwidth", "", "also run the CPU test with transfers limited to this many bytes/s (e.g. 500MB)")
	runs := fs.Int("runs", 3, "runs per figure (medians are printed)")
	nice := fs.Int("transfer-nice", 10, "also run the CPU test with the transfer's threads at this nice value, as an agent run under `nice -n N` (0: no such run)")
	noS3 := fs.Bool("no-s3", false, "skip the S3 figures")
	s3 := tiers.DefaultS3Config()
	fs.StringVar(&s3.Endpoint, "s3-endpoint", "", "S3 endpoint, host:port or http(s)://host:port (empty: start bin/minio on a free loopback port for the run)")
	fs.StringVar(&s3.URL, "s3-url", "", "s3://bucket/prefix to write the benchmark's objects under (with --s3-endpoint)")
	fs.StringVar(&s3.Region, "s3-region", s3.Region, "the bucket's region")
	fs.StringVar(&s3.CredentialsFile, "s3-credentials-file", "", "AWS shared-credentials file (default: $AWS_ACCESS_KEY_ID and $AWS_SECRET_ACCESS_KEY)")
	fs.StringVar(&s3.CredentialsProfile, "s3-profile", "", "section of --s3-credentials-file (default: default)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg := bench.TiersConfig{Dir: *dir, ShmDir: *shmDir, Runs: *runs, Chunk: 8 << 20, S3: s3, NoS3: *noS3, TransferNice: *nice, Log: os.Stderr}
	for _, f := range []struct {
		flag, val string
		dst       *int64
	}{{"size", *size, &cfg.Size}, {"cpu-size", *cpuSize, &cfg.CPUSize}, {"bandwidth", *bandwidth, &cfg.Bandwidth}} {
		if f.val == "" {
			continue
		}
		n, err := units.ParseBytes(f.val)
		if err != nil {
			return fmt.Errorf("--%s: %w", f.flag, err)
		}
		*f.dst = int64(n)
	}
	fmt.Printf("rewind-dev bench tiers: medians of %d runs, in %s (segments in %s)\n", cfg.Runs, cfg.Dir, cfg.ShmDir)
	fmt.Println("  nvme: FileStore.Put (O_DIRECT, fsync, rename) against dd oflag=direct conv=fsync bs=8M of the same size")
	fmt.Println("  s3: the S3 store's Put and Get against one minio-go PutObject and GetObject of the same bytes, same server")
	fmt.Println("  cpu: a CPU-bound loop on one locked thread, alone and beside a Put of a shared-memory segment")
	r, err := bench.Tiers(ctx, cfg)
	if err != nil {
		return err
	}
	bench.PrintTiers(os.Stdout, r)
	return nil
}
