package sdk_test

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/internal/jobtoken"
	"rewind.dev/rewind/internal/segsock"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/sdk"
)

// isolated starts an agent process that isolates jobs, and returns its
// socket and the keys its tokens are minted with.
func isolated(t *testing.T) (string, jobtoken.Keys) {
	t.Helper()
	return isolatedAgent(t, false)
}

// isolatedAgent is isolated, with a private shared-memory root when
// private (testcluster.AgentProcess.PrivateRoot).
func isolatedAgent(t *testing.T, private bool) (string, jobtoken.Keys) {
	t.Helper()
	key := filepath.Join(t.TempDir(), "job.key")
	if err := jobtoken.WriteFile(key); err != nil {
		t.Fatal(err)
	}
	keys, err := jobtoken.Load(key)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testcluster.AgentConfig(t)
	testcluster.SpawnAgent(t, testcluster.AgentProcess{Node: "iso", ShmRoot: cfg.ShmRoot, Socket: cfg.Socket, JobKey: key, PrivateRoot: private})
	return cfg.Socket, keys
}

// TestJobCannotTouchAnotherJobsShards: on an agent process that isolates
// jobs, a client holding job A's token, one with no token and one with a
// forged token each fail, PermissionDenied naming why, to list, open,
// read, save into or delete job B's shards through the SDK; job A's own
// saves and restores work, and job B's shards are untouched.
func TestJobCannotTouchAnotherJobsShards(t *testing.T) {
	socket, keys := isolated(t)
	ctx := ctxT(t)
	b := testcluster.Dial(t, socket, sdk.Options{JobToken: keys.Token("job-b")})
	sb := session(t, b, "job-b", 0, 1)
	for step := int64(1); step <= 2; step++ {
		if err := sb.Save(ctx, step, state(step), nil); err != nil {
			t.Fatalf("job B's own save: %v", err)
		}
	}
	a := testcluster.Dial(t, socket, sdk.Options{JobToken: keys.Token("job-a")})
	sa := session(t, a, "job-a", 0, 1)
	if err := sa.Save(ctx, 7, state(7), nil); err != nil {
		t.Fatalf("job A's own save: %v", err)
	}
	mustRestoreState(t, sa, 7, state(7))

	callers := map[string]struct {
		c    *sdk.Client
		want string
	}{
		"job A's token": {a, "is not job job-b's"},
		"no token":      {testcluster.Dial(t, socket), "with no job token"},
		"forged token":  {testcluster.Dial(t, socket, sdk.Options{JobToken: "rwj1.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}), "is not job job-b's"},
	}
	ops := map[string]func(c *sdk.Client) error{
		"list":         func(c *sdk.Client) error { _, err := c.List(ctx, "job-b"); return err },
		"restore":      func(c *sdk.Client) error { _, err := session(t, c, "job-b", 0, 1).Restore(ctx); return err },
		"restore step": func(c *sdk.Client) error { _, err := session(t, c, "job-b", 0, 1).RestoreStep(ctx, 2); return err },
		"latest":       func(c *sdk.Client) error { _, _, err := session(t, c, "job-b", 0, 1).Latest(ctx); return err },
		"save":         func(c *sdk.Client) error { return session(t, c, "job-b", 0, 1).Save(ctx, 3, state(3), nil) },
		"delete": func(c *sdk.Client) error {
			_, err := c.API().Delete(ctx, &agentpb.DeleteRequest{Job: "job-b", AllRanks: true, Step: -1})
			return err
		},
	}
	for who, caller := range callers {
		for op, call := range ops {
			t.Run(who+"/"+op, func(t *testing.T) {
				err := call(caller.c)
				if !errors.Is(err, sdk.ErrPermission) && status.Code(err) != codes.PermissionDenied {
					t.Fatalf("%s of job B's shards with %s: %v, want PermissionDenied", op, who, err)
				}
				// The refusal names the caller as the kernel saw it
				// (SO_PEERCRED): this process.
				if me := fmt.Sprintf("pid %d (uid %d, gid %d)", os.Getpid(), os.Getuid(), os.Getgid()); !strings.Contains(err.Error(), caller.want) || !strings.Contains(err.Error(), me) {
					t.Fatalf("%s with %s: %v, want it to say %q and name %s", op, who, err, caller.want, me)
				}
			})
		}
	}
	if _, err := a.List(ctx, ""); !errors.Is(err, sdk.ErrPermission) {
		t.Fatalf("listing every job's shards with job A's token: %v, want PermissionDenied", err)
	}
	shards, err := b.List(ctx, "job-b")
	if err != nil || len(shards) != 2 {
		t.Fatalf("job B's shards after the attempts: %d, %v; want its 2", len(shards), err)
	}
	mustRestoreState(t, sb, 2, state(2))
}

// TestHandWrittenClientCannotReachAnotherJob: a gRPC client written by
// hand over the agent's socket, sending job A's token, is refused every
// call on job B's shards (Read's stream too) and every call that spans
// jobs; by hand on the segment socket, it gets no descriptor of job B's
// segments, even holding a lease job B was given.
func TestHandWrittenClientCannotReachAnotherJob(t *testing.T) {
	socket, keys := isolated(t)
	ctx := ctxT(t)
	b := testcluster.Dial(t, socket, sdk.Options{JobToken: keys.Token("job-b")})
	if err := session(t, b, "job-b", 0, 1).Save(ctx, 1, state(1), nil); err != nil {
		t.Fatal(err)
	}
	open, err := b.API().Open(ctx, &agentpb.OpenRequest{Job: "job-b", Rank: 0, Latest: true})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	raw := agentpb.NewAgentClient(conn)
	actx := metadata.AppendToOutgoingContext(ctx, "rewind-job-token", keys.Token("job-a"))
	calls := map[string]func() error{
		"List":     func() error { _, err := raw.List(actx, &agentpb.ListRequest{Job: "job-b"}); return err },
		"List all": func() error { _, err := raw.List(actx, &agentpb.ListRequest{}); return err },
		"Open":     func() error { _, err := raw.Open(actx, &agentpb.OpenRequest{Job: "job-b", Latest: true}); return err },
		"Delete":   func() error { _, err := raw.Delete(actx, &agentpb.DeleteRequest{Job: "job-b", Step: -1}); return err },
		"Verify":   func() error { _, err := raw.Verify(actx, &agentpb.VerifyRequest{Job: "job-b", Step: 1}); return err },
		"Prepare": func() error {
			_, err := raw.Prepare(actx, &agentpb.PrepareRequest{Job: "job-b", WorldSize: 1, Step: 5, SizeBytes: 8192})
			return err
		},
		"Consistent": func() error { _, err := raw.Consistent(actx, &agentpb.ConsistentRequest{Job: "job-b"}); return err },
		"Release":    func() error { _, err := raw.Release(actx, &agentpb.ReleaseRequest{Lease: open.Lease}); return err },
		"Read": func() error {
			st, err := raw.Read(actx, &agentpb.ReadRequest{Job: "job-b", Step: 1})
			if err == nil {
				_, err = st.Recv()
			}
			return err
		},
		"TierCopies": func() error {
			st, err := raw.TierCopies(actx, &agentpb.TierCopiesRequest{})
			if err == nil {
				_, err = st.Recv()
			}
			return err
		},
	}
	for name, call := range calls {
		if err := call(); status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s for job B with job A's token: %v, want PermissionDenied", name, err)
		}
	}

	seg, err := net.Dial(segsock.Network, segsock.Path(socket))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { seg.Close() })
	lease := &agentpb.SegmentRequest_Lease{Lease: open.Lease}
	for name, tc := range map[string]struct {
		req  *agentpb.SegmentRequest
		want codes.Code
	}{
		"job B's lease, job A's token": {&agentpb.SegmentRequest{Job: "job-b", Slot: open.Shard.Slot, JobToken: keys.Token("job-a"), Grant: lease}, codes.PermissionDenied},
		"job B's lease, no token":      {&agentpb.SegmentRequest{Job: "job-b", Slot: open.Shard.Slot, Grant: lease}, codes.PermissionDenied},
		"job B's lease as job A's":     {&agentpb.SegmentRequest{Job: "job-a", Slot: open.Shard.Slot, JobToken: keys.Token("job-a"), Grant: lease}, codes.FailedPrecondition},
	} {
		if err := segsock.Write(seg.(*net.UnixConn), tc.req, nil); err != nil {
			t.Fatal(err)
		}
		var resp agentpb.SegmentResponse
		files, err := segsock.Read(seg.(*net.UnixConn), &resp)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			f.Close()
		}
		if codes.Code(resp.Code) != tc.want || len(files) != 0 {
			t.Errorf("segment request %s: code %v (%s), %d descriptors; want %v and none", name, codes.Code(resp.Code), resp.Error, len(files), tc.want)
		}
	}
	// Job B's lease, asked for with job B's token: granted (the refusals
	// above were the token's, not a broken socket's).
	var resp agentpb.SegmentResponse
	if err := segsock.Write(seg.(*net.UnixConn), &agentpb.SegmentRequest{Job: "job-b", Slot: open.Shard.Slot, JobToken: keys.Token("job-b"), Grant: lease}, nil); err != nil {
		t.Fatal(err)
	}
	files, err := segsock.Read(seg.(*net.UnixConn), &resp)
	if err != nil || resp.Code != 0 || len(files) != 1 {
		t.Fatalf("job B's own segment request: %v, %+v, %d descriptors", err, &resp, len(files))
	}
	files[0].Close()
}

// TestPrivateRootServedByDescriptor: with the agent's shared-memory root
// out of the rank's reach (a pod that mounts only the socket directory),
// every read of the SDK goes through a descriptor the agent hands over:
// a rank's own restore and a restore at another world size, which reads
// every saved rank's shard, both bit-exact.
func TestPrivateRootServedByDescriptor(t *testing.T) {
	if why := testcluster.PrivateRootOK(); why != "" {
		t.Skip(why)
	}
	socket, keys := isolatedAgent(t, true)
	c := testcluster.Dial(t, socket, sdk.Options{JobToken: keys.Token("pr")})
	gs := model(11)
	saveSharded(t, c, "pr", 5, gs, 4)
	shards, err := c.List(ctxT(t), "pr")
	if err != nil || len(shards) != 4 {
		t.Fatalf("shards saved: %d, %v; want 4", len(shards), err)
	}
	if _, err := os.Stat(shards[0].Path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the segment %s is reachable by path from the rank (%v): the test's private root is not private", shards[0].Path, err)
	}
	ckpt, err := session(t, c, "pr", 1, 4).Restore(ctxT(t))
	if err != nil || ckpt.Step != 5 {
		t.Fatalf("rank 1's own restore: %v", err)
	}
	assembled := make([][]byte, len(gs))
	for i, g := range gs {
		assembled[i] = make([]byte, len(g.data))
	}
	for j := range 3 {
		l := layoutFor(gs, j, 3, 1)
		if _, err := session(t, c, "pr", uint32(j), 3).RestoreInto(ctxT(t), l); err != nil {
			t.Fatalf("restore at world size 3, rank %d: %v", j, err)
		}
		for i, sl := range l.Slices {
			place(assembled[i], gs[i], sl)
		}
	}
	for i, g := range gs {
		if !bytes.Equal(assembled[i], g.data) {
			t.Fatalf("tensor %q assembled from the restore at world size 3 differs from the saved one", g.name)
		}
	}
}
