package tiers

import (
	"bytes"
	"errors"
	"fmt"
	"io"
)

// A SliceReaderAt is a source whose bytes are in memory already (a mapped
// shared-memory segment): SliceAt hands out [off, off+n) in place, valid
// until the call it was given to returns. A FileStore writing with
// O_DIRECT writes such slices straight to the disk, with no copy into
// buffers of its own: the transfer then costs training almost no CPU
// time nor memory bandwidth beside the disk's own DMA. ErrNoSlice (from a
// wrapper whose source cannot) means: copy with ReadAt instead.
type SliceReaderAt interface {
	io.ReaderAt
	SliceAt(off int64, n int) ([]byte, error)
}

// ErrNoSlice is SliceAt's answer when the bytes are not in memory to hand
// out: the caller copies them with ReadAt.
var ErrNoSlice = errors.New("tiers: source cannot hand out its bytes in place")

// BytesReaderAt returns a SliceReaderAt over b.
func BytesReaderAt(b []byte) SliceReaderAt { return bytesReaderAt(b) }

type bytesReaderAt []byte

func (b bytesReaderAt) ReadAt(p []byte, off int64) (int, error) {
	return bytes.NewReader(b).ReadAt(p, off)
}

func (b bytesReaderAt) SliceAt(off int64, n int) ([]byte, error) {
	if off < 0 || n < 0 || off+int64(n) > int64(len(b)) {
		return nil, fmt.Errorf("tiers: slice [%d, %d) outside %d bytes", off, off+int64(n), len(b))
	}
	return b[off : off+int64(n) : off+int64(n)], nil
}

// SliceAt asks src for [off, off+n) in place; ErrNoSlice when src is no
// SliceReaderAt or cannot.
func SliceAt(src io.ReaderAt, off int64, n int) ([]byte, error) {
	s, ok := src.(SliceReaderAt)
	if !ok {
		return nil, ErrNoSlice
	}
	return s.SliceAt(off, n)
}

// A SliceWriterAt is a destination whose memory is there to be filled in
// place (a segment mapped for a restore): SliceAt hands out [off, off+n)
// for the caller to write, valid until the call it was given to returns.
// An S3Store's Get reads each range straight into it, with no copy
// through buffers of its own. ErrNoSlice means: write with WriteAt.
type SliceWriterAt interface {
	io.WriterAt
	SliceAt(off int64, n int) ([]byte, error)
}

// DestSliceAt asks dst for [off, off+n) to write in place; ErrNoSlice when
// dst is no SliceWriterAt or cannot.
func DestSliceAt(dst io.WriterAt, off int64, n int) ([]byte, error) {
	s, ok := dst.(SliceWriterAt)
	if !ok {
		return nil, ErrNoSlice
	}
	return s.SliceAt(off, n)
}

// SliceAt hands out the destination's memory to be written in place
// (memWriter is a SliceWriterAt: GetShard and ReadManifest read into it).
func (w *memWriter) SliceAt(off int64, n int) ([]byte, error) {
	if off < 0 || n < 0 || off+int64(n) > int64(len(w.b)) {
		return nil, &pastDestError{n: int64(n), off: off, size: len(w.b)}
	}
	return w.b[off : off+int64(n) : off+int64(n)], nil
}
