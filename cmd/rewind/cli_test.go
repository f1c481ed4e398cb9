package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
	"rewind.dev/rewind/tiers"
)

// capture runs a command's run function and returns what it printed.
func capture(t *testing.T, run func(context.Context, []string) error, args ...string) (string, error) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stdout
	os.Stdout = w
	errc := make(chan error, 1)
	go func() { errc <- run(context.Background(), args); w.Close() }()
	out, _ := io.ReadAll(r)
	os.Stdout = old
	return string(out), <-errc
}

// captureStderr points os.Stderr at a pipe until the returned function,
// which gives back what was written to it.
func captureStderr(t *testing.T) func() string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stderr
	os.Stderr = w
	got := make(chan string, 1)
	go func() { b, _ := io.ReadAll(r); got <- string(b) }()
	var once sync.Once
	read := func() string {
		once.Do(func() { os.Stderr = old; w.Close() })
		return <-got
	}
	t.Cleanup(func() { once.Do(func() { os.Stderr = old; w.Close() }) })
	return read
}

// TestOperatorCommands runs the operator commands against a real
// coordinator and agent on loopback, as an operator would.
func TestOperatorCommands(t *testing.T) {
	ctx := t.Context()
	addr := testcluster.StartCoordinator(t, testcluster.CoordinatorConfig(t)).Addr
	acfg := testcluster.AgentConfig(t)
	acfg.Node, acfg.CoordinatorAddr = "node-a", addr
	acfg.ListenAddr = testcluster.FreeAddr(t)
	acfg.AdvertiseAddr = acfg.ListenAddr
	acfg.Logger = testcluster.Discard()
	nvme, err := tiers.NewFileStore(filepath.Join(t.TempDir(), "nvme"), tiers.NVMeOptions())
	if err != nil {
		t.Fatal(err)
	}
	acfg.Stores = map[tiers.Name]tiers.Store{"nvme": nvme}
	cl := testcluster.StartAgent(t, acfg).Dial(t)
	s, _ := cl.Session("cli-job", 0, 1)
	for step := int64(1); step <= 2; step++ {
		if err := s.Save(ctx, step, []sdk.Tensor{{Name: "w", DType: shm.F32, Shape: []int64{2, 2}, Data: make([]byte, 16)}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	co := "--coordinator=" + addr
	if !testcluster.Plaintext() { // the operator's certificate, as an operator's shell sets it
		t.Setenv(EnvTLSDir, testcluster.TLSDir(t, testcluster.OperatorID))
	}
	wait.ForNil(t, 10*time.Second, "rewind ls to show step 2 consistent", func() error {
		if out, _ := capture(t, runLs, co); !strings.Contains(out, "cli-job") || !strings.Contains(out, " 2 ") {
			return fmt.Errorf("it shows:\n%s", out)
		}
		return nil
	})
	expect := func(run func(context.Context, []string) error, wantErr bool, want []string, args ...string) string {
		t.Helper()
		out, err := capture(t, run, args...)
		if (err != nil) != wantErr {
			t.Fatalf("rewind %v: err %v, want error %v\n%s", args, err, wantErr, out)
		}
		for _, w := range want {
			if !strings.Contains(out, w) && (err == nil || !strings.Contains(err.Error(), w)) {
				t.Fatalf("rewind %v: output lacks %q:\n%s %v", args, w, out, err)
			}
		}
		return out
	}
	// The default policy copies a job's first consistent step to NVMe.
	var onNVMe string
	wait.ForNil(t, 10*time.Second, "rewind ls JOB to show a durable NVMe copy", func() error {
		out, _ := capture(t, runLs, co, "cli-job")
		i := strings.Index(out, "nvme:durable")
		if i < 0 {
			return fmt.Errorf("it shows:\n%s", out)
		}
		line := out[strings.LastIndex(out[:i], "\n")+1:]
		onNVMe = strings.Fields(line)[0]
		return nil
	})
	out := expect(runLs, false, []string{"STEP", "consistent", "1/1", "shm:node-a", "nvme:node-a", "nvme:durable",
		"RECOVERY POINT", "memory of two nodes"}, co, "cli-job")
	if !slices.ContainsFunc(strings.Split(out, "\n"), func(l string) bool {
		f := strings.Fields(l)
		return len(f) == 3 && f[0] == "nvme" && f[1] == onNVMe
	}) {
		t.Fatalf("ls JOB does not show the NVMe recovery point at step %s:\n%s", onNVMe, out)
	}
	expect(runLs, false, []string{"TIER POLICY", "nvme:every=10,keep=2"}, co)
	expect(runTiers, false, []string{"NODE", "node-a", "nvme", "file://", "ok"}, co)
	expect(runTiers, false, []string{"TIER", "nvme", "durable", "4.0 KiB"}, co, "--wait", "cli-job", onNVMe)
	expect(runPolicy, false, []string{"cli-job: nvme:every=100,keep=2"}, co, "cli-job", "nvme:every=100,keep=2")
	expect(runPolicy, false, []string{"cli-job: nvme:every=100,keep=2"}, co, "cli-job")
	expect(runPolicy, true, []string{"unknown tier"}, co, "cli-job", "tape:every=1,keep=1")
	expect(runVerify, false, []string{"nvme", "ok"}, co, "cli-job", onNVMe)
	expect(runInspect, false, []string{"job cli-job step 2: consistent", "node-a"}, co, "cli-job", "2")
	expect(runVerify, false, []string{"node-a", "ok"}, co, "cli-job", "2")
	expect(runRestore, false, []string{"step 2, 1 rank; a restart would delete no later step (dry run", "shm:node-a"}, co, "cli-job", "--dry-run")
	expect(runRestore, false, []string{"restored job cli-job: step 2, 1 rank in", "ok", "shm:node-a"}, co, "cli-job")
	expect(runDelete, true, []string{"latest consistent"}, co, "cli-job", "2")
	deleted := "deleted 1 copy of"
	if onNVMe == "1" { // and its NVMe copy
		deleted = "deleted 2 copies"
	}
	expect(runDelete, false, []string{deleted}, co, "cli-job", "1")
	out = expect(runLs, false, nil, co, "--json")
	var jobs struct {
		Jobs []struct {
			ID               string `json:"id"`
			LatestConsistent int64  `json:"latest_consistent"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal([]byte(out), &jobs); err != nil || len(jobs.Jobs) != 1 || jobs.Jobs[0].LatestConsistent != 2 {
		t.Fatalf("ls --json: %v %s", err, out)
	}
	// Many steps at once, piped: one result per step on standard
	// output, and no progress line on standard error. The rank restarts
	// from the restore above first.
	s, _ = cl.Session("cli-job", 0, 1)
	if _, err := s.RestoreStep(ctx, 2); err != nil {
		t.Fatal(err)
	}
	for step := int64(3); step <= 5; step++ {
		if err := s.Save(ctx, step, []sdk.Tensor{{Name: "w", DType: shm.F32, Shape: []int64{2, 2}, Data: make([]byte, 16)}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	wait.ForNil(t, 10*time.Second, "step 5 consistent", func() error {
		if out, _ := capture(t, runLs, co); !strings.Contains(out, " 5 ") {
			return fmt.Errorf("it shows:\n%s", out)
		}
		return nil
	})
	// Retention has freed some of steps 2-4 by now (step 2 stays when it
	// is the one on NVMe): the ranges name the steps the coordinator
	// lists.
	listed := func() (steps []string) {
		var l struct {
			Steps []struct{ Step int64 } `json:"steps"`
		}
		if err := json.Unmarshal([]byte(expect(runLs, false, nil, co, "--json", "cli-job")), &l); err != nil {
			t.Fatal(err)
		}
		for _, st := range l.Steps {
			if st.Step >= 2 && st.Step <= 4 {
				steps = append(steps, fmt.Sprint(st.Step))
			}
		}
		return steps
	}
	early := listed()
	stderr := captureStderr(t)
	want := []string{"job cli-job step 5:", "ok"}
	for _, st := range early {
		want = append(want, "job cli-job step "+st+":")
	}
	expect(runVerify, false, want, co, "cli-job", "2-5")
	if len(early) > 0 {
		out = expect(runDelete, false, []string{"deleted", "step " + early[0] + "\n"}, co, "cli-job", "2-4")
		if strings.Contains(out, "step 5") {
			t.Fatalf("delete 2-4 deleted step 5:\n%s", out)
		}
	}
	if left := listed(); len(left) > 0 {
		t.Fatalf("steps %v listed after delete 2-4", left)
	}
	expect(runDelete, true, []string{"no step in the ranges"}, co, "cli-job", "2-4")
	if got := stderr(); got != "" {
		t.Fatalf("piped, the commands wrote to standard error: %q", got)
	}
	// Agent-side views through the socket.
	expect(runLs, false, []string{"node node-a", "cli-job", "committed"}, "--socket="+acfg.Socket)
	expect(runInspect, false, []string{"job cli-job  rank 0 of 1  step 5", "F32", "every checksum matches"}, "--socket="+acfg.Socket, "--job=cli-job", "--rank=0", "--verify")
	expect(runVerify, true, []string{"no coordinator"}, "cli-job", "2")
}
