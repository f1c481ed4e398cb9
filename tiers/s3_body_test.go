package tiers

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
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
		time.Sleep(300 * time.Millisecond) // let a transport still writing a body run into the cut
		src.mu.Lock()
		late, reads := src.late, src.reads
		src.mu.Unlock()
		if late > 0 {
			t.Errorf("put of %d bytes: %d of %d reads of the source came after Put returned", size, late, reads)
		}
	}
}
