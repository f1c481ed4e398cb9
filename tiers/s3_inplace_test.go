package tiers

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"rewind.dev/rewind/shm"
)

// TestS3GetInPlace: a destination that hands out its memory (a
// SliceWriterAt, as a segment mapped for a restore) is read into in place
// and gets the same bytes as one written through WriteAt; a bad byte in
// transit still fails the Get as corrupt; a destination that refuses a
// range fails the Get as the destination's error, not retried.
func TestS3GetInPlace(t *testing.T) {
	ft := &s3FlipTransport{}
	s, _ := newS3(t, func(c *S3Config) { c.Transport = ft })
	ctx := t.Context()
	for _, size := range []int64{1, s3InPlaceChunk + 3, 2*s3MinPartSize + 12345} {
		name := fmt.Sprint("inplace-", size)
		want := s3Rand(uint64(size)+7, size)
		if err := s.Put(ctx, name, bytes.NewReader(want), size); err != nil {
			t.Fatal(err)
		}
		dst := &memWriter{b: make([]byte, size)}
		if n, err := s.Get(ctx, name, dst); err != nil || n != size || !bytes.Equal(dst.b, want) {
			t.Fatalf("in-place Get of %d bytes: n %d, %v, bit-identical %v", size, n, err, bytes.Equal(dst.b, want))
		}

		ft.on.Store(true)
		_, err := s.Get(ctx, name, &memWriter{b: make([]byte, size)})
		ft.on.Store(false)
		if !errors.Is(err, shm.ErrCorrupt) || !strings.Contains(err.Error(), "checksum mismatch") {
			t.Errorf("in-place Get of %d bytes damaged in transit: %v, want ErrCorrupt", size, err)
		}

		_, err = s.Get(ctx, name, &memWriter{b: make([]byte, size-1)})
		var se *S3Error
		if !errors.As(err, &se) || se.Attempts > 1 || !strings.Contains(err.Error(), "writing destination") {
			t.Errorf("in-place Get of %d bytes into %d: %v, want a destination error, not retried", size, size-1, err)
		}
	}
}

// TestDestSliceAt: only a SliceWriterAt hands out memory; a wrapper that
// hides it (a bandwidth limit) is written through WriteAt.
func TestDestSliceAt(t *testing.T) {
	w := &memWriter{b: make([]byte, 10)}
	b, err := DestSliceAt(w, 2, 5)
	if err != nil || len(b) != 5 || cap(b) != 5 {
		t.Fatalf("DestSliceAt = len %d cap %d, %v; want 5 bytes", len(b), cap(b), err)
	}
	b[0] = 1
	if w.b[2] != 1 {
		t.Error("the slice handed out is not the destination's memory")
	}
	if _, err := DestSliceAt(w, 8, 5); err == nil || errors.Is(err, ErrNoSlice) {
		t.Errorf("DestSliceAt past the end: %v, want a range error", err)
	}
	if _, err := DestSliceAt(struct{ io.WriterAt }{w}, 0, 1); !errors.Is(err, ErrNoSlice) {
		t.Errorf("DestSliceAt of a plain WriterAt: %v, want ErrNoSlice", err)
	}
}
