package shm_test

import (
	"bytes"
	"os"
	"runtime/debug"
	"testing"

	"rewind.dev/rewind/shm"
	"rewind.dev/rewind/vfs"
)

// The way a writer and a reader use a segment: reserve it, map it writable,
// write a shard through the mapping, unmap; then map it read-only elsewhere,
// decode and verify it.
func TestMapWriteThenRead(t *testing.T) {
	root := shmRoot(t)
	segs := newSegments(vfs.Default, root)
	specs := []shm.TensorSpec{
		{Name: "w", DType: shm.BF16, Shape: []int64{shm.LeafSize + 5}},
		{Name: "b", DType: shm.F32, Shape: []int64{3}},
		{Name: "n", DType: shm.U8, Shape: []int64{7}}, // the file is not a whole number of pages
	}
	s := buildShard(t, testMeta, specs, []byte(`{"lr":0.1}`))
	path := segs.Paths.Segment(testMeta.Job, testMeta.Rank, 0)
	size := s.layout.Size
	if size%4096 == 0 {
		t.Fatal("the test shard should not be page-aligned")
	}
	reserve(t, segs, path, size, true)

	f, err := vfs.Default.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	m, err := shm.Map(f, size, true)
	if err != nil {
		t.Fatalf("Map writable: %v", err)
	}
	if err := f.Close(); err != nil { // the mapping outlives the descriptor
		t.Fatal(err)
	}
	if int64(len(m.Data)) != size {
		t.Fatalf("mapping is %d bytes, want %d", len(m.Data), size)
	}
	copy(m.Data, s.file)
	if err := m.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if m.Data != nil {
		t.Errorf("Data still set after Close")
	}
	if err := m.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}

	f, err = vfs.Default.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h, err := shm.Decode(f, size) // through the file, not the mapping
	if err != nil {
		t.Fatalf("Decode from the segment file: %v", err)
	}
	if _, err := shm.Map(f, size, true); err == nil {
		t.Errorf("Map writable succeeded on a read-only descriptor")
	}
	r, err := shm.Map(f, size, false)
	if err != nil {
		t.Fatalf("Map read-only: %v", err)
	}
	defer r.Close()
	if !bytes.Equal(r.Data, s.file) {
		t.Fatal("read-only mapping does not hold what was written through the writable one")
	}
	if err := h.Verify(r.Data, 2); err != nil {
		t.Fatalf("Verify through the mapping: %v", err)
	}

	// A read-only mapping really is read-only: a store faults.
	func() {
		defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
		defer func() {
			if recover() == nil {
				t.Errorf("storing into a read-only mapping did not fault")
			}
		}()
		r.Data[100] ^= 0xFF
	}()
	if got, _ := os.ReadFile(path); !bytes.Equal(got, s.file) {
		t.Errorf("segment changed through the read-only mapping")
	}
}

func TestMapRejectsEmpty(t *testing.T) {
	root := shmRoot(t)
	segs := newSegments(vfs.Default, root)
	path := segs.Paths.Segment("j", 0, 0)
	reserve(t, segs, path, 4096, true)
	f, err := vfs.Default.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, size := range []int64{0, -1} {
		if m, err := shm.Map(f, size, true); err == nil {
			m.Close()
			t.Errorf("Map(%d bytes) succeeded", size)
		}
	}
}

// Prefault beside a writer, as a copy from a peer runs it: it never
// changes a byte, whether the writer is ahead of it or behind, in a new
// segment (pages not yet zeroed) or in one that holds data already; and
// it stops when told.
func TestPrefaultBesideWriter(t *testing.T) {
	const size = 40<<20 + 4096 + 100 // several pieces, the last short
	root := shmRoot(t)
	segs := newSegments(vfs.Default, root)
	want := make([]byte, size)
	fill(want, 7)
	for name, old := range map[string][]byte{"new segment": nil, "segment with data": bytes.Repeat([]byte{0xA5}, size)} {
		path := segs.Paths.Segment("prefault", 0, 0)
		os.Remove(path)
		reserve(t, segs, path, size, true)
		if old != nil {
			if err := os.WriteFile(path, old, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		f, err := vfs.Default.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		m, err := shm.MapLazy(f, size, true)
		f.Close()
		if err != nil {
			t.Fatalf("%s: MapLazy: %v", name, err)
		}
		done, stopped := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(stopped)
			m.Prefault(done)
		}()
		for off := 0; off < size; off += 1 << 20 { // the writer, in pieces
			copy(m.Data[off:min(off+1<<20, size)], want[off:])
		}
		close(done)
		<-stopped
		m.Close()
		if got, _ := os.ReadFile(path); !bytes.Equal(got, want) {
			t.Errorf("%s: the segment does not hold what was written beside Prefault", name)
		}
	}
	// Told to stop before it starts, it returns at once.
	path := segs.Paths.Segment("prefault", 0, 1)
	reserve(t, segs, path, size, true)
	f, err := vfs.Default.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := shm.MapLazy(f, size, true)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	done := make(chan struct{})
	close(done)
	m.Prefault(done)
	if _, err := shm.MapLazy(f, size+4096, true); err == nil {
		t.Error("MapLazy past the end of the file succeeded")
	}
}
