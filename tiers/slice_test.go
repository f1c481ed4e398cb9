package tiers

import (
	"bytes"
	"context"
	"io"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// spySource is a mapped, page-aligned source that counts the bytes taken
// in place (SliceAt) and copied (ReadAt).
type spySource struct {
	b              []byte
	sliced, copied atomic.Int64
}

func (s *spySource) ReadAt(p []byte, off int64) (int, error) {
	n, err := BytesReaderAt(s.b).ReadAt(p, off)
	s.copied.Add(int64(n))
	return n, err
}

func (s *spySource) SliceAt(off int64, n int) ([]byte, error) {
	s.sliced.Add(int64(n))
	return BytesReaderAt(s.b).SliceAt(off, n)
}

// TestFileStorePutsSlicesInPlace: with O_DIRECT, a source that can hand
// out its bytes in place (a mapped segment) is written straight from its
// memory, whole chunks at a time, through a bandwidth limiter too; only
// an odd tail is copied. Buffered writes copy. The object reads back
// bit-identical either way.
func TestFileStorePutsSlicesInPlace(t *testing.T) {
	opts := NVMeOptions()
	opts.ChunkBytes, opts.DirectMinBytes = 1<<16, 1<<17
	const size = 1<<20 + 12345
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	copy(mem, data(size, 7))
	ctx := context.Background()
	for name, tc := range map[string]struct {
		direct  bool
		limited bool
	}{"direct": {true, false}, "direct, limited": {true, true}, "buffered": {false, false}} {
		t.Run(name, func(t *testing.T) {
			o := opts
			o.Direct = tc.direct
			s, err := NewFileStore(t.TempDir(), o)
			if err != nil {
				t.Fatal(err)
			}
			spy := &spySource{b: mem}
			var src io.ReaderAt = spy
			if tc.limited {
				src = LimitReaderAt(ctx, spy, NewLimiter(10<<30, nil))
			}
			if err := s.Put(ctx, "job/step-1/rank-0.safetensors", src, size); err != nil {
				t.Fatal(err)
			}
			got, err := get(t, s, "job/step-1/rank-0.safetensors")
			if err != nil || !bytes.Equal(got, mem) {
				t.Fatalf("read back: %v, equal %v", err, bytes.Equal(got, mem))
			}
			whole := int64(size / opts.ChunkBytes * opts.ChunkBytes)
			wantSliced, wantCopied := whole, int64(size)-whole
			if !tc.direct {
				wantSliced, wantCopied = 0, size
			}
			if spy.sliced.Load() != wantSliced || spy.copied.Load() != wantCopied {
				t.Fatalf("%d bytes written in place and %d copied, want %d and %d",
					spy.sliced.Load(), spy.copied.Load(), wantSliced, wantCopied)
			}
		})
	}
}

// TestS3PutsSlicesInPlace: the object store reads a source that hands out
// its bytes in place once, straight from its memory (no copy for the
// CRC32C pass), in one part and in several; the object reads back whole
// and the server's CRC32C matches.
func TestS3PutsSlicesInPlace(t *testing.T) {
	s, _ := newS3(t, nil)
	for name, size := range map[string]int{"single": 1<<20 + 3, "multipart": s3MinPartSize + 4099} {
		t.Run(name, func(t *testing.T) {
			spy := &spySource{b: data(size, 9)}
			obj := "job/step-1/rank-" + name
			if err := s.Put(t.Context(), obj, spy, int64(size)); err != nil {
				t.Fatal(err)
			}
			if spy.copied.Load() != 0 || spy.sliced.Load() != int64(size) {
				t.Fatalf("%d bytes taken in place, %d copied; want all %d in place", spy.sliced.Load(), spy.copied.Load(), size)
			}
			if got := s3MustGet(t, s, obj); !bytes.Equal(got, spy.b) {
				t.Fatal("the object reads back different")
			}
		})
	}
}
