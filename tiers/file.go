package tiers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"rewind.dev/rewind/internal/units"
	"rewind.dev/rewind/vfs"
)

// FileOptions tune a FileStore.
type FileOptions struct {
	// Writers is how many goroutines write one object: 1 suits a local
	// NVMe drive; a parallel filesystem spreads one large file over
	// servers and wants several.
	Writers int
	// ChunkBytes is what one writer reads and writes at a time.
	ChunkBytes int
	// Direct writes with O_DIRECT from aligned buffers, bypassing the page
	// cache, for objects of at least DirectMinBytes; it falls back to
	// buffered I/O where the file system refuses O_DIRECT (tmpfs).
	Direct         bool
	DirectMinBytes int64
	// FS is the file system; nil means the operating system's.
	FS vfs.FS
}

// NVMeOptions suit a node-local NVMe drive.
func NVMeOptions() FileOptions {
	return FileOptions{
		Writers:        2,       // two streams keep one NVMe queue busy; more compete with training for memory bandwidth
		ChunkBytes:     8 << 20, // large sequential writes, few syscalls
		Direct:         true,    // checkpoints are written once and read rarely: keep them out of the page cache
		DirectMinBytes: 16 << 20,
	}
}

// PFSOptions suit a shared or parallel filesystem mounted on every node.
func PFSOptions() FileOptions {
	o := NVMeOptions()
	o.Writers = 8 // stripes of one file land on several servers
	o.Direct = false
	return o
}

// FileStore is a Store in a local directory: writes go to a temporary name,
// are fsynced, renamed into place, and the directory is fsynced, so an
// object is either whole or absent after a crash.
type FileStore struct {
	root string
	opts FileOptions
	fs   vfs.FS
}

var _ Store = (*FileStore)(nil)

// NewFileStore returns a store rooted at dir, creating it.
func NewFileStore(dir string, opts FileOptions) (*FileStore, error) {
	if opts.Writers < 1 || opts.ChunkBytes < unix.Getpagesize() || opts.ChunkBytes%unix.Getpagesize() != 0 {
		return nil, fmt.Errorf("tiers: file store %s: writers %d and chunk %d bytes (a multiple of the page size) are required", dir, opts.Writers, opts.ChunkBytes)
	}
	fsys := opts.FS
	if fsys == nil {
		fsys = vfs.Default
	}
	if err := fsys.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("tiers: file store: %w", err)
	}
	if err := checkStoreDir(fsys, dir); err != nil {
		return nil, err
	}
	return &FileStore{root: dir, opts: opts, fs: fsys}, nil
}

// checkStoreDir refuses a directory that cannot hold a tier: one that is
// not a directory, one on a kernel pseudo file system (/proc, /sys: it
// stores nothing, and writing there changes the kernel, not a disk), or
// one this process may not write.
func checkStoreDir(fsys vfs.FS, dir string) error {
	fi, err := fsys.Stat(dir)
	if err != nil {
		return fmt.Errorf("tiers: file store: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("tiers: file store %s is not a directory", dir)
	}
	st, err := fsys.Statfs(dir)
	if err != nil {
		return fmt.Errorf("tiers: file store: %w", err)
	}
	if st.Pseudo {
		return fmt.Errorf("tiers: file store %s is on %s, a kernel pseudo file system that stores nothing; give a directory on a disk or a shared file system", dir, st.Type)
	}
	if err := unix.Access(dir, unix.W_OK|unix.X_OK); err != nil {
		return fmt.Errorf("tiers: file store %s (on %s) cannot be written by this process: %w", dir, st.Type, err)
	}
	return nil
}

func (s *FileStore) String() string { return "file://" + s.root }

func (s *FileStore) path(name string) (string, error) {
	if err := checkName(name); err != nil {
		return "", err
	}
	return filepath.Join(s.root, filepath.FromSlash(name)), nil
}

// tmpSuffix marks files being written; List never returns them.
const tmpSuffix = ".rewind-tmp"

// Put implements Store.
func (s *FileStore) Put(ctx context.Context, name string, src io.ReaderAt, size int64) (err error) {
	path, err := s.path(name)
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	if err := s.fs.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("tiers: %s: %w", s, err)
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	tmp := path + "." + hex.EncodeToString(rnd[:]) + tmpSuffix
	direct := s.opts.Direct && size >= s.opts.DirectMinBytes
	f, direct, err := s.create(tmp, direct)
	if err != nil {
		return fmt.Errorf("tiers: %s: creating %s: %w", s, name, err)
	}
	defer func() {
		if err != nil {
			f.Close()
			_ = s.fs.Remove(tmp)
		}
	}()
	if size > 0 {
		// Reserve the space first: a full disk is one clear error before
		// any byte is written.
		if err := f.Allocate(0, size); err != nil && !errors.Is(err, syscall.EOPNOTSUPP) {
			return fmt.Errorf("tiers: %s: reserving %s for %s: %w", s, units.Bytes(uint64(size)), name, err)
		}
	}
	if err := s.write(ctx, f, src, size, direct); err != nil {
		return fmt.Errorf("tiers: %s: writing %s: %w", s, name, err)
	}
	if direct && size%int64(unix.Getpagesize()) != 0 {
		if err := f.Truncate(size); err != nil { // drop the aligned tail's padding
			return fmt.Errorf("tiers: %s: %w", s, err)
		}
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("tiers: %s: fsync %s: %w", s, name, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("tiers: %s: close %s: %w", s, name, err)
	}
	if err := s.fs.Rename(tmp, path); err != nil {
		return fmt.Errorf("tiers: %s: rename %s into place: %w", s, name, err)
	}
	return s.syncDir(dir)
}

// create opens a new file, with O_DIRECT when asked and the file system
// takes it; it reports whether the file is direct.
func (s *FileStore) create(path string, direct bool) (vfs.File, bool, error) {
	flags := os.O_WRONLY | os.O_CREATE | os.O_EXCL
	if direct {
		f, err := s.fs.OpenFile(path, flags|syscall.O_DIRECT, 0o640)
		if err == nil {
			return f, true, nil
		}
		if !errors.Is(err, syscall.EINVAL) {
			return nil, false, err
		}
	}
	f, err := s.fs.OpenFile(path, flags, 0o640)
	return f, false, err
}

// write copies size bytes from src to f with the configured writers, each
// with its own page-aligned buffer (O_DIRECT needs aligned memory, offsets
// and lengths; the last chunk is padded and truncated by the caller).
func (s *FileStore) write(ctx context.Context, f vfs.File, src io.ReaderAt, size int64, direct bool) error {
	chunk := int64(s.opts.ChunkBytes)
	alignedBuf := func() ([]byte, func(), error) {
		buf, err := unix.Mmap(-1, 0, int(chunk), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		return buf, func() { unix.Munmap(buf) }, err
	}
	return parallel(ctx, s.opts.Writers, (size+chunk-1)/chunk, alignedBuf, func(ctx context.Context, buf []byte, i int64) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		off := i * chunk
		l := min(chunk, size-off)
		if direct {
			if b, ok, err := directSlice(src, off, l); err != nil {
				return err
			} else if ok {
				_, err := f.WriteAt(b, off) // straight from the source's memory
				return err
			}
		}
		if _, err := src.ReadAt(buf[:l], off); err != nil && !(errors.Is(err, io.EOF) && off+l == size) {
			return fmt.Errorf("reading source at %d: %w", off, err)
		}
		w := l
		if direct {
			page := int64(unix.Getpagesize())
			w = (l + page - 1) / page * page
			clear(buf[l:w])
		}
		_, err := f.WriteAt(buf[:w], off)
		return err
	})
}

// directSlice returns [off, off+n) of src in place when src can hand it
// out and O_DIRECT can write it as it is: page-aligned in memory and a
// whole number of pages long (the last chunk of an odd size is copied
// and padded instead).
func directSlice(src io.ReaderAt, off, n int64) ([]byte, bool, error) {
	page := int64(unix.Getpagesize())
	if n%page != 0 {
		return nil, false, nil
	}
	b, err := SliceAt(src, off, int(n))
	if errors.Is(err, ErrNoSlice) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("reading source at %d: %w", off, err)
	}
	if uintptr(unsafe.Pointer(unsafe.SliceData(b)))%uintptr(page) != 0 {
		return nil, false, nil
	}
	return b, true, nil
}

func (s *FileStore) syncDir(dir string) error {
	d, err := s.fs.OpenFile(dir, os.O_RDONLY, 0)
	if err != nil {
		return fmt.Errorf("tiers: %s: %w", s, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("tiers: %s: fsync directory %s: %w", s, dir, err)
	}
	return nil
}

// Get implements Store.
func (s *FileStore) Get(ctx context.Context, name string, dst io.WriterAt) (int64, error) {
	path, err := s.path(name)
	if err != nil {
		return 0, err
	}
	f, err := s.fs.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return 0, fmt.Errorf("tiers: %s: %s: %w", s, name, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	size := fi.Size()
	chunk := int64(s.opts.ChunkBytes)
	heapBuf := func() ([]byte, func(), error) { return make([]byte, chunk), nil, nil }
	err = parallel(ctx, s.opts.Writers, (size+chunk-1)/chunk, heapBuf, func(ctx context.Context, buf []byte, i int64) error {
		err := ctx.Err()
		off := i * chunk
		l := min(chunk, size-off)
		if err == nil {
			_, err = f.ReadAt(buf[:l], off)
			if errors.Is(err, io.EOF) && off+l == size {
				err = nil
			}
		}
		if err == nil {
			_, err = dst.WriteAt(buf[:l], off)
		}
		if err != nil {
			return fmt.Errorf("tiers: %s: reading %s at %d: %w", s, name, off, err)
		}
		return nil
	})
	return size, err
}

// Size implements Store.
func (s *FileStore) Size(ctx context.Context, name string) (int64, error) {
	path, err := s.path(name)
	if err != nil {
		return 0, err
	}
	fi, err := s.fs.Stat(path)
	if err != nil {
		return 0, fmt.Errorf("tiers: %s: %w", s, err)
	}
	return fi.Size(), nil
}

// List implements Store.
func (s *FileStore) List(ctx context.Context, prefix string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(s.root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(s.root, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel != "." && !strings.HasPrefix(rel+"/", prefix) && !strings.HasPrefix(prefix, rel+"/") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasPrefix(rel, prefix) && !strings.HasSuffix(rel, tmpSuffix) {
			out = append(out, rel)
		}
		return ctx.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("tiers: %s: list %q: %w", s, prefix, err)
	}
	slices.Sort(out)
	return out, nil
}

// Delete implements Store.
func (s *FileStore) Delete(ctx context.Context, name string) error {
	path, err := s.path(name)
	if err != nil {
		return err
	}
	if err := s.fs.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("tiers: %s: %w", s, err)
	}
	return nil
}
