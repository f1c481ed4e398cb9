package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"rewind.dev/rewind/internal/clock"
	"rewind.dev/rewind/shm"
)

// The helpers below run inside the cluster's containers, which have no
// shell (`rewind-dev chaos-tool ...` through docker exec or as a one-shot
// service).

// fillName is the file Fill writes at the root of the volume.
const fillName = "chaos-fill"

// Fill writes a file into dir until its file system is full (ENOSPC) and
// returns the bytes written. It is the "NVMe full" fault: the tier's next
// writes fail for want of space.
func Fill(dir string) (int64, error) {
	f, err := os.OpenFile(filepath.Join(dir, fillName), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, fmt.Errorf("chaos: fill %s: %w", dir, err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i * 131)
	}
	var n int64
	for range 1 << 16 { // 64 GiB at most: a volume larger than that is not a test volume
		w, err := f.Write(buf)
		n += int64(w)
		if errors.Is(err, syscall.ENOSPC) {
			for range 256 { // the last pages may still fit in smaller writes
				w, err := f.Write(buf[:4096])
				n += int64(w)
				if err != nil {
					break
				}
			}
			return n, nil
		}
		if err != nil {
			return n, fmt.Errorf("chaos: fill %s: %w", dir, err)
		}
	}
	return n, fmt.Errorf("chaos: fill %s: wrote %d bytes and it is still not full", dir, n)
}

// Unfill removes what Fill wrote.
func Unfill(dir string) error {
	if err := os.Remove(filepath.Join(dir, fillName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("chaos: unfill %s: %w", dir, err)
	}
	return nil
}

// MakeBucket creates bucket on the S3 endpoint (http[s]://host:port) with
// the credentials of the AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY
// environment variables, retrying until the server answers or timeout
// passes. A bucket that exists is fine.
func MakeBucket(ctx context.Context, endpoint, bucket string, timeout time.Duration) error {
	secure := strings.HasPrefix(endpoint, "https://")
	host := strings.TrimPrefix(strings.TrimPrefix(endpoint, "https://"), "http://")
	cl, err := minio.New(host, &minio.Options{
		Creds:  credentials.NewStaticV4(os.Getenv("AWS_ACCESS_KEY_ID"), os.Getenv("AWS_SECRET_ACCESS_KEY"), ""),
		Secure: secure,
	})
	if err != nil {
		return fmt.Errorf("chaos: s3 endpoint %s: %w", endpoint, err)
	}
	deadline := time.Now().Add(timeout)
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = cl.MakeBucket(cctx, bucket, minio.MakeBucketOptions{})
		if err != nil {
			if ok, e2 := cl.BucketExists(cctx, bucket); e2 == nil && ok {
				err = nil
			}
		}
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("chaos: creating bucket %s on %s within %v: %w", bucket, endpoint, timeout, err)
		}
		if clock.Sleep(ctx, 500*time.Millisecond) != nil {
			return ctx.Err()
		}
	}
}

// Corrupted is a shard Corrupt damaged.
type Corrupted struct {
	Slot   uint32 `json:"slot"`
	Step   int64  `json:"step"`
	Offset int64  `json:"offset"`
	Gone   bool   `json:"gone,omitempty"` // no such copy any more (CorruptTier: removed by the tier's retention)
}

// Corrupt flips one byte in the tensor data of every committed segment of
// a rank under a shared-memory root (the agent's slots.json names them)
// of a step after after (-1: every one), in place: the agent's mapping
// sees it, as it would see memory rotting after the agent verified the
// shard. Reading the shard must now fail its checksum. With after < 0,
// a rank with no committed segment is an error.
func Corrupt(shmRoot, job string, rank uint32, after int64) ([]Corrupted, error) {
	paths := shm.Paths{Root: shmRoot}
	b, err := os.ReadFile(paths.SlotsFile(job, rank))
	if err != nil {
		return nil, fmt.Errorf("chaos: corrupt: %w", err)
	}
	var sf struct {
		Slots []struct {
			Slot  uint32 `json:"slot"`
			State string `json:"state"`
			Step  int64  `json:"step"`
			Size  int64  `json:"size"`
		} `json:"slots"`
	}
	if err := json.Unmarshal(b, &sf); err != nil {
		return nil, fmt.Errorf("chaos: corrupt: %s: %w", paths.SlotsFile(job, rank), err)
	}
	var out []Corrupted
	for _, s := range sf.Slots {
		if s.State != "committed" || s.Step <= after {
			continue
		}
		off, err := flipData(paths.Segment(job, rank, s.Slot), s.Size)
		if err != nil {
			return out, err
		}
		out = append(out, Corrupted{Slot: s.Slot, Step: s.Step, Offset: off})
	}
	if len(out) == 0 && after < 0 {
		return nil, fmt.Errorf("chaos: corrupt: job %s rank %d has no committed segment under %s", job, rank, shmRoot)
	}
	return out, nil
}

// flipData inverts one byte in the middle of a shard's tensor data.
func flipData(path string, size int64) (int64, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return 0, fmt.Errorf("chaos: corrupt: %w", err)
	}
	defer f.Close()
	h, _, err := shm.ReadHeader(f, size)
	if err != nil {
		return 0, fmt.Errorf("chaos: corrupt: %s: %w", path, err)
	}
	off := h.DataStart + (size-h.DataStart)/2
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		return 0, fmt.Errorf("chaos: corrupt: %s: %w", path, err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, off); err != nil {
		return 0, fmt.Errorf("chaos: corrupt: %s: %w", path, err)
	}
	return off, nil
}
