package shm_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"rewind.dev/rewind/internal/units"
	"rewind.dev/rewind/shm"
	"rewind.dev/rewind/vfs"
)

// shmRoot returns a fresh directory on the machine's /dev/shm, removed when
// the test ends.
func shmRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "rewind-test-")
	if err != nil {
		t.Skipf("no writable /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if st, err := vfs.Default.Statfs(dir); err != nil || !st.Tmpfs {
		t.Skipf("/dev/shm is not tmpfs here (%+v, %v)", st, err)
	}
	return dir
}

// smallTmpfs mounts a tmpfs of the given size ("8m") for the test, or skips
// the test where mounting is not permitted.
func smallTmpfs(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		t.Skipf("cannot mount a %s tmpfs on %s (%v): mounting needs CAP_SYS_ADMIN; run the tests as root to cover a full shared memory", size, dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmounting %s: %v", dir, err)
		}
	})
	return dir
}

func newSegments(fs vfs.FS, root string) *shm.Segments {
	return &shm.Segments{FS: fs, Paths: shm.Paths{Root: root}, FileMode: 0o600}
}

// checkSegment asserts that the file at path has exactly size bytes, all of
// them allocated (so that no store through a mapping can fault), and starts
// with prefix.
func checkSegment(t *testing.T, path string, size int64, prefix []byte) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != size {
		t.Errorf("%s is %d bytes, want %d", filepath.Base(path), st.Size, size)
	}
	if st.Blocks*512 < size {
		t.Errorf("%s has %d bytes allocated for %d bytes: not reserved", filepath.Base(path), st.Blocks*512, size)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) < len(prefix) || !bytes.Equal(got[:len(prefix)], prefix) {
		t.Errorf("%s: contents changed", filepath.Base(path))
	}
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(b, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func reserve(t *testing.T, s *shm.Segments, path string, size int64, wantResized bool) {
	t.Helper()
	resized, err := s.Reserve(path, size)
	if err != nil || resized != wantResized {
		t.Fatalf("Reserve(%d bytes) = %v, %v; want %v, nil", size, resized, err, wantResized)
	}
}

func TestReserve(t *testing.T) {
	root := shmRoot(t)
	s := newSegments(vfs.Default, root)
	path := s.Paths.Segment("job-1", 2, 0)

	reserve(t, s, path, shm.LeafSize+3, true) // creates the directories and the file
	checkSegment(t, path, shm.LeafSize+3, nil)
	reserve(t, s, path, shm.LeafSize+3, false)

	content := make([]byte, shm.LeafSize+3)
	fill(content, 5)
	writeFile(t, path, content)
	reserve(t, s, path, shm.LeafSize+3, false) // a warm slot is left alone
	checkSegment(t, path, shm.LeafSize+3, content)

	reserve(t, s, path, 4096, true) // shrink
	checkSegment(t, path, 4096, content[:4096])
	reserve(t, s, path, 4096, false)

	reserve(t, s, path, 3*shm.LeafSize, true) // grow
	checkSegment(t, path, 3*shm.LeafSize, append(bytes.Clone(content[:4096]), make([]byte, 3*shm.LeafSize-4096)...))

	// More than the whole file system: refused before anything changes.
	st, err := vfs.Default.Statfs(root)
	if err != nil {
		t.Fatal(err)
	}
	huge := int64(st.Size) + 1<<30
	_, err = s.Reserve(path, huge)
	ns := checkNoSpace(t, err, path, root)
	checkTooLittleFree(t, ns)
	if ns != nil && ns.Asked != uint64(huge-3*shm.LeafSize) {
		t.Errorf("Asked = %d, want %d (beyond the %d bytes the segment holds)", ns.Asked, huge-3*shm.LeafSize, 3*shm.LeafSize)
	}
	checkSegment(t, path, 3*shm.LeafSize, content[:4096])

	other := s.Paths.Segment("job-1", 2, 1)
	_, err = s.Reserve(other, huge)
	if ns := checkNoSpace(t, err, other, root); ns != nil && ns.Asked != uint64(huge) {
		t.Errorf("Asked = %d for a new segment of %d bytes", ns.Asked, huge)
	}
}

// checkTooLittleFree asserts that a NoSpaceError from a really full file
// system does not contradict itself.
func checkTooLittleFree(t *testing.T, ns *shm.NoSpaceError) {
	t.Helper()
	if ns != nil && ns.Free >= ns.Asked {
		t.Errorf("%q: says %d bytes are free, enough for the %d asked", ns, ns.Free, ns.Asked)
	}
}

// checkNoSpace asserts that err is a *NoSpaceError for path under root whose
// message tells an operator what was asked, what is free, and where.
func checkNoSpace(t *testing.T, err error, path, root string) *shm.NoSpaceError {
	t.Helper()
	var ns *shm.NoSpaceError
	if !errors.As(err, &ns) {
		t.Errorf("error %v (%T), want *shm.NoSpaceError", err, err)
		return nil
	}
	if ns.Path != path || ns.Mount != root {
		t.Errorf("NoSpaceError %+v: want path %s, mount %s", ns, path, root)
	}
	msg := ns.Error()
	for _, want := range []string{units.Bytes(ns.Asked), units.Bytes(ns.Free), root} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q does not say %q", msg, want)
		}
	}
	return ns
}

func TestReserveFullTmpfs(t *testing.T) {
	root := smallTmpfs(t, "8m")
	s := newSegments(vfs.Default, root)
	a, b := s.Paths.Segment("j", 0, 0), s.Paths.Segment("j", 0, 1)
	content := make([]byte, 4<<20)
	fill(content, 11)
	reserve(t, s, a, 4<<20, true)
	writeFile(t, a, content)

	_, err := s.Reserve(b, 16<<20)
	if ns := checkNoSpace(t, err, b, root); ns != nil {
		checkTooLittleFree(t, ns)
		if ns.Asked != 16<<20 || ns.Free > 4<<20 || !strings.Contains(ns.Error(), "16.0 MiB") {
			t.Errorf("NoSpaceError %+v (%q): want 16 MiB asked, at most 4 MiB free", ns, ns.Error())
		}
	}
	_, err = s.Reserve(a, 16<<20)
	checkTooLittleFree(t, checkNoSpace(t, err, a, root))
	checkSegment(t, a, 4<<20, content)

	// What is left fits exactly.
	reserve(t, s, b, 4<<20, true)
	checkSegment(t, a, 4<<20, content)
}

// When the free-space check passes but the kernel still runs out (another
// process took the space in between: here Statfs lies once), fallocate
// fails with ENOSPC: the caller gets a NoSpaceError that reports the space
// actually free, the segment is as it was, and no shared memory stays
// allocated.
func TestReserveFallocateENOSPC(t *testing.T) {
	root := smallTmpfs(t, "8m")
	liar := &faultFS{FS: vfs.Default, free: 1 << 40, lies: 1}
	s := newSegments(liar, root)
	a, b := s.Paths.Segment("j", 0, 0), s.Paths.Segment("j", 0, 1)
	content := make([]byte, 4<<20)
	fill(content, 13)
	reserve(t, s, a, 4<<20, true)
	writeFile(t, a, content)
	before, err := vfs.Default.Statfs(root)
	if err != nil {
		t.Fatal(err)
	}

	liar.lies = 1
	_, err = s.Reserve(a, 16<<20)
	checkTooLittleFree(t, checkNoSpace(t, err, a, root))
	liar.lies = 1
	_, err = s.Reserve(b, 16<<20)
	checkTooLittleFree(t, checkNoSpace(t, err, b, root))
	if liar.allocCalls != 3 {
		t.Fatalf("Allocate called %d times, want 3: the test did not reach fallocate", liar.allocCalls)
	}
	checkSegment(t, a, 4<<20, content)
	if after, _ := vfs.Default.Statfs(root); after.Free != before.Free {
		t.Errorf("free space %d before the failed reservations, %d after", before.Free, after.Free)
	}
}

// faultFS wraps an FS: Statfs reports free bytes when free is set (only
// the next lies calls when lies is set), and Allocate fails with allocErr
// when it is set.
type faultFS struct {
	vfs.FS
	free       uint64
	lies       int
	statfsErr  error
	allocErr   error
	allocCalls int
}

func (f *faultFS) Statfs(path string) (vfs.FSStat, error) {
	if f.statfsErr != nil {
		return vfs.FSStat{}, f.statfsErr
	}
	st, err := f.FS.Statfs(path)
	if f.free != 0 && f.lies >= 0 {
		st.Free = f.free
		if f.lies == 1 {
			f.lies = -1
		}
	}
	return st, err
}

func (f *faultFS) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	file, err := f.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return faultFile{File: file, fs: f}, nil
}

type faultFile struct {
	vfs.File
	fs *faultFS
}

func (f faultFile) Allocate(off, length int64) error {
	f.fs.allocCalls++
	if f.fs.allocErr != nil {
		return f.fs.allocErr
	}
	return f.File.Allocate(off, length)
}

func TestReserveFaults(t *testing.T) {
	cases := map[string]struct {
		fs          faultFS
		wantNoSpace bool
		wantErr     error // wrapped by the error, when not a NoSpaceError
		wantAllocs  int
	}{
		"fallocate ENOSPC":            {fs: faultFS{allocErr: syscall.ENOSPC}, wantNoSpace: true, wantAllocs: 1},
		"fallocate ENOSPC, wrapped":   {fs: faultFS{allocErr: os.NewSyscallError("fallocate", syscall.ENOSPC)}, wantNoSpace: true, wantAllocs: 1},
		"fallocate EIO":               {fs: faultFS{allocErr: syscall.EIO}, wantErr: syscall.EIO, wantAllocs: 1},
		"statfs says too little free": {fs: faultFS{free: 4096}, wantNoSpace: true, wantAllocs: 0},
		"statfs fails":                {fs: faultFS{statfsErr: syscall.EACCES}, wantErr: syscall.EACCES, wantAllocs: 0},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			root := shmRoot(t)
			path := shm.Paths{Root: root}.Segment("j", 0, 0)
			reserve(t, newSegments(vfs.Default, root), path, 4096, true)
			content := bytes.Repeat([]byte{0xC3}, 4096)
			writeFile(t, path, content)

			fs := tc.fs
			fs.FS = vfs.Default
			_, err := newSegments(&fs, root).Reserve(path, 1<<20)
			var ns *shm.NoSpaceError
			switch {
			case tc.wantNoSpace:
				if ns = checkNoSpace(t, err, path, root); ns != nil && ns.Asked != 1<<20-4096 {
					t.Errorf("Asked = %d, want %d", ns.Asked, 1<<20-4096)
				}
			case err == nil || errors.As(err, &ns) || !errors.Is(err, tc.wantErr):
				t.Errorf("Reserve: %v; want an error wrapping %v that is not a NoSpaceError", err, tc.wantErr)
			}
			if fs.allocCalls != tc.wantAllocs {
				t.Errorf("Allocate called %d times, want %d", fs.allocCalls, tc.wantAllocs)
			}
			checkSegment(t, path, 4096, content)
		})
	}
}

// Directories get an x bit for every class the file mode lets read or
// write, or that class could never reach its segments.
func TestReserveDirectoryModes(t *testing.T) {
	umask := os.FileMode(syscall.Umask(0))
	syscall.Umask(int(umask))
	for _, mode := range []os.FileMode{0o600, 0o640, 0o660, 0o644, 0o666} {
		t.Run(mode.String(), func(t *testing.T) {
			root := shmRoot(t)
			s := &shm.Segments{FS: vfs.Default, Paths: shm.Paths{Root: root}, FileMode: mode}
			path := s.Paths.Segment("j", 0, 0)
			reserve(t, s, path, 4096, true)
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != mode&^umask {
				t.Errorf("segment mode %v, want %v", fi.Mode().Perm(), mode&^umask)
			}
			for _, dir := range []string{filepath.Dir(path), filepath.Dir(filepath.Dir(path))} {
				di, err := os.Stat(dir)
				if err != nil {
					t.Fatal(err)
				}
				dm := di.Mode().Perm()
				for _, class := range []struct {
					name string
					rw   os.FileMode
					x    os.FileMode
				}{{"owner", 0o600, 0o100}, {"group", 0o060, 0o010}, {"others", 0o006, 0o001}} {
					if fi.Mode().Perm()&class.rw != 0 && umask&class.x == 0 && dm&class.x == 0 {
						t.Errorf("file mode %v lets %s use the segment, but directory %s is %v", fi.Mode().Perm(), class.name, dir, dm)
					}
				}
			}
		})
	}
}
