package tiers

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"rewind.dev/rewind/internal/wait"
)

// lateReader is a source that notes any read begun after the Put reading
// it returned: with a mapped segment as the source, such a read touches
// memory the caller may have unmapped (a SIGSEGV that killed an agent).
type lateReader struct {
	data     []byte
	returned atomic.Bool
	mu       sync.Mutex
	reads    int
	late     int
}

func (r *lateReader) ReadAt(p []byte, off int64) (int, error) {
	r.mu.Lock()
	r.reads++
	if r.returned.Load() {
		r.late++
	}
	r.mu.Unlock()
	return copy(p, r.data[off:]), nil
}

// TestS3PutNeverReadsSourceAfterReturn: MinIO refuses a request by its
// headers (a wrong secret key) and answers before the body is sent;
// net/http goes on writing the body after the round trip returned. Put
// must cut the body off when it returns.
func TestS3PutNeverReadsSourceAfterReturn(t *testing.T) {
	good, _ := newS3(t, nil)
	cfg := good.cfg
	cfg.SecretKey = "not-the-secret"
	cfg.PartSize = 256 << 20 // one request: the refusal comes while its body is sent
	bad, err := NewS3Store(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, size := range []int64{4 << 20, 192 << 20} {
		src := &lateReader{data: make([]byte, size)}
		for i := range 5 {
			src.returned.Store(false)
			err := bad.Put(t.Context(), "refused", src, size)
			src.returned.Store(true)
			if err == nil {
				t.Fatalf("put of %d bytes with a wrong secret key succeeded", size)
			}
			if i == 0 {
				t.Logf("put of %d bytes refused: %v", size, err)
			}
		}
		// Nothing says a transport is done with a body it was still
		// writing: give one the time to run into the cut, watching.
		wait.Holds(t, 300*time.Millisecond, fmt.Sprintf("no read of the %d-byte source after Put returned", size), func() error {
			src.mu.Lock()
			defer src.mu.Unlock()
			if src.late > 0 {
				return fmt.Errorf("%d of %d reads came after Put returned", src.late, src.reads)
			}
			return nil
		})
	}
}
