package tiers

import (
	"context"
	"errors"
	"io"
	"io/fs"
)

// Store is one durable tier. Object names are slash-separated paths
// ("job/step-00000042/rank-00003.safetensors"), never starting with '/',
// never containing "." or ".." elements.
//
// Every method takes a context and honours its cancellation. Methods may be
// called concurrently, also for the same name: the last Put to complete
// wins, and a reader never sees a partial object.
type Store interface {
	// Put stores size bytes read from src (with ReadAt, possibly from
	// several goroutines at once) as name. The object is visible only once
	// Put returns nil, and then whole: a failed or cancelled Put leaves
	// any earlier object of that name as it was, and no partial one. One
	// exception: a file store whose directory fsync fails after the
	// rename returns that error with the new object in place, whole but
	// not known durable (names are per step, so no earlier object of the
	// same name is a different checkpoint).
	Put(ctx context.Context, name string, src io.ReaderAt, size int64) error
	// Get writes the whole object into dst (with WriteAt, possibly from
	// several goroutines at once) and returns its size. dst must accept
	// writes up to the object's size (see Size).
	Get(ctx context.Context, name string, dst io.WriterAt) (int64, error)
	// Size returns the size of the object, or an error for which
	// IsNotExist is true.
	Size(ctx context.Context, name string) (int64, error)
	// List returns the names under prefix (a name prefix, not only a
	// directory), sorted.
	List(ctx context.Context, prefix string) ([]string, error)
	// Delete removes the object; deleting a missing object is not an error.
	Delete(ctx context.Context, name string) error
	// String names the store for logs and listings, without credentials.
	String() string
}

// ErrNotExist is returned (wrapped) for a missing object.
var ErrNotExist = fs.ErrNotExist

// IsNotExist reports whether err says an object does not exist.
func IsNotExist(err error) bool { return errors.Is(err, ErrNotExist) }

// checkName validates an object name.
func checkName(name string) error {
	if !fs.ValidPath(name) || name == "." {
		return &fs.PathError{Op: "tiers", Path: name, Err: fs.ErrInvalid}
	}
	return nil
}
