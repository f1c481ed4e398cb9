// Package snippets compiles the Go code of README.md and docs/sdk-go.md
// and runs it against a real agent. TestSnippetsAreTheDocs checks that
// every ```go block of those files is in this file word for word
// (whitespace aside, imports apart), so a snippet that stops compiling
// or doing what its text says fails here.
package snippets

import (
	"bytes"
	"context"
	"errors"
	"log"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
)

// What the snippets take from the training program around them.
var (
	rank, worldSize uint32 = 0, 1
	steps           int64
	w0              = make([]byte, 4096*4096*2) // a [4096, 4096] BF16 tensor
	lr              = 3e-4
	pos             = 0
	trained, loaded []int64
)

func train(step int64)          { trained = append(trained, step) }
func load(ckpt *sdk.Checkpoint) { loaded = append(loaded, ckpt.Step) }

// readmeQuickStart is README.md's "Quick start: Go SDK".
func readmeQuickStart(ctx context.Context) error {
	c, err := sdk.Dial(ctx, "") // $REWIND_SOCKET or /run/rewind/agent.sock
	if err != nil {
		return err
	}
	s, err := c.Session("llama-70b-run3", rank, worldSize)
	if err != nil {
		return err
	}
	step := int64(0)
	if ckpt, err := s.Restore(ctx); err == nil {
		step = ckpt.Step + 1 // ckpt.Tensors, ckpt.Objects: bit-identical to what was saved
	} else if !errors.Is(err, sdk.ErrNotFound) {
		return err
	}
	for ; step < steps; step++ {
		train(step)
		err := s.Save(ctx, step, []sdk.Tensor{
			{Name: "layers.0.weight", DType: shm.BF16, Shape: []int64{4096, 4096}, Data: w0},
		}, map[string]any{"lr": lr, "data_pos": pos})
		if err != nil {
			log.Printf("checkpoint of step %d failed, training on: %v", step, err) // the previous one is intact
		}
	}
	return c.Close()
}

// sdkGoLoop is the training loop at the top of docs/sdk-go.md.
func sdkGoLoop(ctx context.Context) error {
	c, err := sdk.Dial(ctx, "") // $REWIND_SOCKET, or /run/rewind/agent.sock
	if err != nil {
		return err
	}
	defer c.Close()
	s, err := c.Session("llama-70b-run3", rank, worldSize)
	if err != nil {
		return err
	}
	defer s.Close()

	step := int64(0)
	if ckpt, err := s.Restore(ctx); err == nil {
		step = ckpt.Step + 1 // ckpt.Tensors and ckpt.Objects: bit-identical to what was saved
		load(ckpt)
	} else if !errors.Is(err, sdk.ErrNotFound) {
		return err
	}
	for ; step < steps; step++ {
		train(step)
		err := s.Save(ctx, step, []sdk.Tensor{
			{Name: "layers.0.weight", DType: shm.BF16, Shape: []int64{4096, 4096}, Data: w0},
		}, map[string]any{"lr": lr, "data_pos": pos})
		if errors.Is(err, sdk.ErrGangBroken) {
			return err // a node of the job was lost: exit; the job is restarted from a checkpoint
		} else if err != nil {
			log.Printf("checkpoint of step %d failed, training on: %v", step, err) // the previous one is intact
		}
	}
	return nil
}

// sdkGoResharding is docs/sdk-go.md's "Resharding".
func sdkGoResharding(ctx context.Context, s *sdk.Session, buf []byte) (*sdk.Resharded, error) {
	res, err := s.RestoreInto(ctx, sdk.Layout{Slices: []sdk.Slice{
		// rows 4-6 of a [10, 4096] weight, every column
		{Name: "w", DType: shm.BF16, Offsets: []int64{4, 0}, Lengths: []int64{3, 4096}, Data: buf},
	}})
	// res.Step, res.SavedWorldSize; res.Objects: rank 0's objects document,
	// or that of the saved rank Layout.ObjectsRank names
	return res, err
}

var (
	goBlock     = regexp.MustCompile("(?s)```go\n(.*?)```")
	importBlock = regexp.MustCompile(`(?s)^import \(.*?\n\)\n`)
)

// words is text as lines of single-spaced words, blank lines dropped.
func words(text string) []string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if l = strings.Join(strings.Fields(l), " "); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// TestSnippetsAreTheDocs: every ```go block of README.md and
// docs/sdk-go.md, its import block aside, is a run of lines of this file.
func TestSnippetsAreTheDocs(t *testing.T) {
	src, err := os.ReadFile("snippets_test.go")
	if err != nil {
		t.Fatal(err)
	}
	here := strings.Join(words(string(src)), "\n") + "\n"
	for _, doc := range []string{"README.md", "docs/sdk-go.md"} {
		text, err := os.ReadFile(filepath.Join("..", "..", doc))
		if err != nil {
			t.Fatal(err)
		}
		blocks := goBlock.FindAllStringSubmatch(string(text), -1)
		if len(blocks) == 0 {
			t.Errorf("%s: no ```go block", doc)
		}
		for i, b := range blocks {
			code := strings.Join(words(importBlock.ReplaceAllString(b[1], "")), "\n") + "\n"
			if !strings.Contains(here, code) {
				t.Errorf("%s: go block %d is not in snippets_test.go (copy it into a function there):\n%s", doc, i+1, b[1])
			}
		}
	}
}

// startAgent starts an agent alone and points $REWIND_SOCKET at it.
func startAgent(t *testing.T) *testcluster.Agent {
	a := testcluster.StartAgent(t, testcluster.AgentConfig(t))
	t.Setenv("REWIND_SOCKET", a.Config.Socket)
	t.Setenv("REWIND_JOB_TOKEN", "")
	t.Setenv("REWIND_JOB_TOKEN_FILE", "")
	return a
}

// latest is the latest committed step of rank 0 of llama-70b-run3.
func latest(t *testing.T, a *testcluster.Agent) int64 {
	s, err := a.Dial(t).Session("llama-70b-run3", 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	step, ok, err := s.Latest(t.Context())
	if err != nil || !ok {
		t.Fatalf("latest: %d %v %v", step, ok, err)
	}
	return step
}

// TestQuickStarts runs the README's loop and docs/sdk-go.md's twice
// each: the first trains from step 0 and saves every step, the second
// (with more steps) resumes after the last one saved.
func TestQuickStarts(t *testing.T) {
	for name, loop := range map[string]func(context.Context) error{"README.md": readmeQuickStart, "docs/sdk-go.md": sdkGoLoop} {
		t.Run(name, func(t *testing.T) {
			a := startAgent(t)
			trained, loaded = nil, nil
			for i, n := range []int64{3, 5} {
				steps = n
				if err := loop(t.Context()); err != nil {
					t.Fatalf("run %d: %v", i+1, err)
				}
				if got := latest(t, a); got != n-1 {
					t.Fatalf("run %d: latest step %d, want %d", i+1, got, n-1)
				}
			}
			if want := []int64{0, 1, 2, 3, 4}; !slices.Equal(trained, want) {
				t.Errorf("trained steps %v, want %v", trained, want)
			}
			if name == "docs/sdk-go.md" && !slices.Equal(loaded, []int64{2}) {
				t.Errorf("loaded %v, want the second run to load step 2", loaded)
			}
		})
	}
}

// TestResharding saves a [10, 4096] BF16 weight as two ranks' chunks
// (rows 0-4 and 5-9), then runs the Resharding snippet as one rank of
// another world size: it gets rows 4-6, across both chunks.
func TestResharding(t *testing.T) {
	ctx := t.Context()
	c := startAgent(t).Dial(t)
	const rows, cols, es = 10, 4096, 2
	global := make([]byte, rows*cols*es)
	for i := range global {
		global[i] = byte(i*7 + i>>13)
	}
	for r := range int64(2) {
		s, err := c.Session("reshard", uint32(r), 2)
		if err != nil {
			t.Fatal(err)
		}
		lo, hi := r*rows/2, (r+1)*rows/2
		if err := s.Save(ctx, 1, []sdk.Tensor{{Name: "w", DType: shm.BF16, Shape: []int64{hi - lo, cols},
			Data:  global[lo*cols*es : hi*cols*es],
			Chunk: &shm.Chunk{GlobalShape: []int64{rows, cols}, Offsets: []int64{lo, 0}}}}, map[string]any{"rank": r}); err != nil {
			t.Fatal(err)
		}
	}
	s, err := c.Session("reshard", 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 3*cols*es)
	res, err := sdkGoResharding(ctx, s, buf)
	if err != nil {
		t.Fatal(err)
	}
	if res.Step != 1 || res.SavedWorldSize != 2 || string(res.Objects) != `{"rank":0}` {
		t.Errorf("step %d, saved world size %d, objects %s; want 1, 2, rank 0's", res.Step, res.SavedWorldSize, res.Objects)
	}
	if !bytes.Equal(buf, global[4*cols*es:7*cols*es]) {
		t.Error("the slice's bytes are not rows 4-6 of the saved weight")
	}
}
