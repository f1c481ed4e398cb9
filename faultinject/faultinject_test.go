package faultinject

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"rewind.dev/rewind/vfs"
)

func TestSpecErrors(t *testing.T) {
	for name, tc := range map[string]struct{ spec, want string }{
		"unknown point":       {"agent/nowhere=error(EIO)", `no fault point "agent/nowhere"`},
		"no term":             {"agent/shard-copied", "want point=term"},
		"kind not here":       {"gossip/send=error(EIO)", `"error" cannot fire here (it takes drop, sleep, reset)`},
		"unknown kind":        {"agent/shard-copied=explode", `unknown kind "explode"`},
		"bad percent":         {"agent/shard-copied=150%error(EIO)", "probability"},
		"bad count":           {"agent/shard-copied=0*error(EIO)", "count"},
		"bad sleep":           {"s3/request=sleep(forever)", "sleep"},
		"bad status":          {"s3/request=status(42)", "HTTP status"},
		"bad exit":            {"agent/shard-copied=exit(300)", "exit status"},
		"error needs arg":     {"agent/shard-copied=error", "error needs an argument"},
		"arg where none":      {"s3/request=reset(1)", "takes no argument"},
		"unclosed":            {"s3/request=sleep(1s", "unclosed"},
		"bad second of chain": {"s3/request=1*reset->bogus", "term 2"},
	} {
		t.Run(name, func(t *testing.T) {
			in := New(nil, 1)
			if err := in.Set("s3/request=reset;" + tc.spec); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Set(%q) = %v, want an error containing %q", tc.spec, err, tc.want)
			}
			if a := in.Armed(); len(a) != 0 {
				t.Fatalf("a bad spec armed %v", a)
			}
		})
	}
}

func TestNilInjectorNeverFires(t *testing.T) {
	var in *Injector
	if f := in.Eval(context.Background(), AgentShardCopied); f.Fired() {
		t.Fatal("nil injector fired")
	}
	if err := in.Set("agent/shard-copied=error(EIO)"); err == nil || !strings.Contains(err.Error(), "--fault-injection") {
		t.Fatalf("Set on a nil injector: %v", err)
	}
	if in.FS(vfs.Default, "tier") != vfs.Default {
		t.Fatal("nil injector wrapped the FS")
	}
}

func TestChainCountsAndErrors(t *testing.T) {
	in := New(nil, 1)
	if err := in.Set("agent/shard-copied = 2*error(ENOSPC) -> 1*off -> error(disk on fire)"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var got []string
	for range 5 {
		err := in.Check(ctx, AgentShardCopied)
		switch {
		case err == nil:
			got = append(got, "ok")
		case errors.Is(err, syscall.ENOSPC):
			got = append(got, "ENOSPC")
		default:
			got = append(got, err.Error())
		}
	}
	want := []string{"ENOSPC", "ENOSPC", "ok", "injected fault at agent/shard-copied: disk on fire", "injected fault at agent/shard-copied: disk on fire"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("got %q\nwant %q", got, want)
	}
	if h := in.Hits()[AgentShardCopied]; h != 4 {
		t.Fatalf("hits %d, want 4 (the off term does not count)", h)
	}
	in.Clear()
	if in.Check(ctx, AgentShardCopied) != nil {
		t.Fatal("fired after Clear")
	}
}

// A seed replays the same firings of a probabilistic term; another seed
// gives others.
func TestPercentReplaysBySeed(t *testing.T) {
	run := func(seed uint64) string {
		in := New(nil, seed)
		if err := in.Set("agent/replica-received=30%corrupt"); err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for range 200 {
			if in.Eval(context.Background(), AgentReplicaReceived).Fired() {
				b.WriteByte('x')
			} else {
				b.WriteByte('.')
			}
		}
		return b.String()
	}
	a, b, c := run(7), run(7), run(8)
	if a != b {
		t.Fatal("the same seed fired differently")
	}
	if a == c {
		t.Fatal("two seeds fired identically")
	}
	if n := strings.Count(a, "x"); n < 30 || n > 90 {
		t.Fatalf("30%% fired %d times in 200", n)
	}
}

func TestExitAndSleep(t *testing.T) {
	in := New(nil, 1)
	code := -1
	in.exit = func(c int) { code = c }
	if err := in.Set("coordinator/before-consistent=1*exit;agent/shard-copied=sleep(30ms)"); err != nil {
		t.Fatal(err)
	}
	in.Eval(context.Background(), CoordBeforeConsistent)
	if code != 137 {
		t.Fatalf("exit status %d, want 137", code)
	}
	t0 := time.Now()
	in.Eval(context.Background(), AgentShardCopied)
	if d := time.Since(t0); d < 30*time.Millisecond {
		t.Fatalf("sleep(30ms) took %v", d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := in.Set("agent/shard-copied=sleep(1h)"); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { in.Eval(ctx, AgentShardCopied); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a sleep outlived its context")
	}
}

func TestFSFaults(t *testing.T) {
	dir := t.TempDir()
	in := New(nil, 3)
	fsys := in.FS(vfs.Default, "tier")
	data := make([]byte, 16<<10)
	for i := range data {
		data[i] = byte(i)
	}
	write := func(name string) (int, error) {
		f, err := fsys.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		return f.WriteAt(data, 0)
	}
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	mustSet(t, in, "fs/tier/write=1*short->1*torn->1*corrupt->1*error(ENOSPC)")
	if n, err := write("short"); n != 8<<10 || !errors.Is(err, io.ErrShortWrite) {
		t.Fatalf("short write: %d, %v", n, err)
	}
	if n, err := write("torn"); n != len(data) || err != nil || len(read("torn")) != 8<<10 {
		t.Fatalf("torn write: %d, %v, %d bytes on disk", n, err, len(read("torn")))
	}
	if n, err := write("corrupt"); n != len(data) || err != nil {
		t.Fatalf("corrupt write: %d, %v", n, err)
	}
	if diff := countDiff(read("corrupt"), data); diff != 1 {
		t.Fatalf("corrupt write changed %d bytes, want 1", diff)
	}
	if _, err := write("full"); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("ENOSPC write: %v", err)
	}
	mustSet(t, in, "fs/tier/sync=1*error(EIO);fs/tier/rename=1*error(EIO)")
	f, _ := fsys.OpenFile(filepath.Join(dir, "short"), os.O_RDWR, 0)
	if err := f.Sync(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("sync: %v", err)
	}
	f.Close()
	if err := fsys.Rename(filepath.Join(dir, "short"), filepath.Join(dir, "x")); !errors.Is(err, syscall.EIO) {
		t.Fatalf("rename: %v", err)
	}
	shmFS := in.FS(vfs.Default, "shm")
	mustSet(t, in, "fs/shm/allocate=1*error(ENOSPC)")
	g, err := shmFS.OpenFile(filepath.Join(dir, "seg"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Allocate(0, 4096); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("allocate: %v", err)
	}
	if err := g.Allocate(0, 4096); err != nil {
		t.Fatalf("allocate after the fault: %v", err)
	}
}

func TestTransportFaults(t *testing.T) {
	body := strings.Repeat("rewind", 1000)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, body) }))
	defer srv.Close()
	in := New(nil, 5)
	c := &http.Client{Transport: in.Transport(srv.Client().Transport)}
	get := func(ctx context.Context) (*http.Response, string, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/bucket/key", nil)
		resp, err := c.Do(req)
		if err != nil {
			return nil, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp, string(b), err
	}
	ctx := context.Background()
	mustSet(t, in, "s3/request=1*status(503)->1*reset->1*corrupt->1*error(ECONNREFUSED)")
	if resp, b, err := get(ctx); err != nil || resp.StatusCode != 503 || !strings.Contains(b, "<Code>SlowDown</Code>") {
		t.Fatalf("status(503): %v %v %q", resp, err, b)
	}
	if _, _, err := get(ctx); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("reset: %v", err)
	}
	if _, b, err := get(ctx); err != nil || len(b) != len(body) || countDiff([]byte(b), []byte(body)) != 1 {
		t.Fatalf("corrupt: %v, %d bytes, %d differ", err, len(b), countDiff([]byte(b), []byte(body)))
	}
	if _, _, err := get(ctx); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("error: %v", err)
	}
	if _, b, err := get(ctx); err != nil || b != body {
		t.Fatalf("after the chain: %v", err)
	}
	mustSet(t, in, "s3/request=1*timeout")
	tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, _, err := get(tctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("timeout: %v", err)
	}
}

func TestHandler(t *testing.T) {
	in := New(nil, 1)
	srv := httptest.NewServer(in.Handler())
	defer srv.Close()
	do := func(method, body string) (int, string) {
		req, _ := http.NewRequest(method, srv.URL, strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, b := do(http.MethodPut, "agent/tier-uploaded=1*exit(3)"); code != 200 {
		t.Fatalf("PUT: %d %s", code, b)
	}
	if code, b := do(http.MethodPut, "agent/tier-uploaded=explode"); code != 400 || !strings.Contains(b, "unknown kind") {
		t.Fatalf("PUT of a bad spec: %d %s", code, b)
	}
	code, b := do(http.MethodGet, "")
	if code != 200 || !strings.Contains(b, `"armed":"1*exit(3)"`) || strings.Count(b, `"name"`) != len(Points) {
		t.Fatalf("GET: %d %s", code, b)
	}
	do(http.MethodDelete, "")
	if _, b := do(http.MethodGet, ""); strings.Contains(b, `"armed"`) {
		t.Fatalf("still armed after DELETE: %s", b)
	}
}

func TestTableIsWellFormed(t *testing.T) {
	seen := map[string]bool{}
	for _, p := range Points {
		if seen[p.Name] || p.Where == "" || p.Shows == "" || len(p.Kinds) == 0 {
			t.Errorf("point %q: duplicate or undocumented", p.Name)
		}
		seen[p.Name] = true
	}
}

// TestEveryPointFired fails when a point of the table was fired by no
// test of the run that recorded hits into $REWIND_FAULT_HITS (make test
// runs it after every other package's tests).
func TestEveryPointFired(t *testing.T) {
	dir := os.Getenv("REWIND_FAULT_COVERAGE")
	if dir == "" {
		t.Skip("REWIND_FAULT_COVERAGE is not set: make test sets it after the run that records hits")
	}
	var missing []string
	for _, p := range Points {
		if _, err := os.Stat(filepath.Join(dir, hitFile(p.Name))); err != nil {
			missing = append(missing, p.Name)
		}
	}
	if len(missing) > 0 {
		t.Fatalf("fault points no test fired: %s", strings.Join(missing, ", "))
	}
}

func mustSet(t *testing.T, in *Injector, spec string) {
	t.Helper()
	if err := in.Set(spec); err != nil {
		t.Fatal(err)
	}
}

func countDiff(a, b []byte) int {
	n := 0
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			n++
		}
	}
	return n + max(len(a), len(b)) - min(len(a), len(b))
}
