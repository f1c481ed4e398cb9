package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/tiers"
)

// putManifest writes a manifest of job's step on st (a listing reads
// manifests, not shards).
func putManifest(t *testing.T, st tiers.Store, job string, step int64, ws uint32, here []uint32) {
	t.Helper()
	m := &tiers.Manifest{Job: job, Step: step, WorldSize: ws, Here: here, WrittenAt: time.Now().UTC()}
	for r := range ws {
		m.Shards = append(m.Shards, tiers.ShardEntry{Rank: r, Size: 4096 + int64(r), HeaderChecksum: fmt.Sprintf("%016x", step*100+int64(r))})
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Put(context.Background(), tiers.ManifestName(job, step), bytes.NewReader(b), int64(len(b))); err != nil {
		t.Fatal(err)
	}
}

// listAll calls TierCopies and returns its pages.
func listAll(t *testing.T, c agentpb.AgentClient, req *agentpb.TierCopiesRequest) ([]*agentpb.TierCopiesPage, error) {
	t.Helper()
	stream, err := c.TierCopies(context.Background(), req)
	if err != nil {
		return nil, err
	}
	var pages []*agentpb.TierCopiesPage
	for {
		p, err := stream.Recv()
		if err == io.EOF {
			return pages, nil
		}
		if err != nil {
			return pages, err
		}
		pages = append(pages, p)
	}
}

type listedStep struct {
	tier, job string
	step      int64
}

// TestTierCopiesListing: an agent lists the manifests of its tiers for a
// coordinator rebuilding its index: every valid one, per tier and job,
// newest steps first, in pages of at most 256; a corrupt manifest is
// skipped and counted, never sent; the bounds per job and per tier stop
// the listing where they say, truncated; an unknown tier is refused.
func TestTierCopiesListing(t *testing.T) {
	nvme, err := tiers.NewFileStore(filepath.Join(t.TempDir(), "nvme"), tiers.NVMeOptions())
	if err != nil {
		t.Fatal(err)
	}
	pfsDir := filepath.Join(t.TempDir(), "pfs")
	pfs, err := tiers.NewFileStore(pfsDir, tiers.PFSOptions())
	if err != nil {
		t.Fatal(err)
	}
	for step := int64(1); step <= 3; step++ {
		putManifest(t, nvme, "a", step, 2, []uint32{1})
	}
	for step := int64(1); step <= 300; step++ {
		putManifest(t, pfs, "big", step, 2, nil)
	}
	putManifest(t, pfs, "small", 7, 1, nil)
	putManifest(t, pfs, "small", 8, 1, nil)
	// Step 8 of small rots: it must not be listed.
	if err := os.WriteFile(filepath.Join(pfsDir, filepath.FromSlash(tiers.ManifestName("small", 8))), []byte(`{"job":"small"`), 0o640); err != nil {
		t.Fatal(err)
	}

	cfg := testcluster.AgentConfig(t)
	cfg.Stores = map[tiers.Name]tiers.Store{"nvme": nvme, "pfs": pfs}
	testcluster.StartAgent(t, cfg)
	conn, err := grpc.NewClient("unix://"+cfg.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := agentpb.NewAgentClient(conn)

	pages, err := listAll(t, c, &agentpb.TierCopiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var got []listedStep
	for i, p := range pages {
		if len(p.Manifests) > 256 || len(p.Listings) > 0 != (i == len(pages)-1) {
			t.Fatalf("page %d of %d: %d manifests, %d listings", i, len(pages), len(p.Manifests), len(p.Listings))
		}
		for _, m := range p.Manifests {
			got = append(got, listedStep{m.Tier, m.Job, m.Step})
			if m.Job == "a" && (!slices.Equal(m.RanksHere, []uint32{1}) || len(m.Shards) != 2 || m.Shards[1].SizeBytes != 4097 || m.WrittenUnixNano == 0) {
				t.Fatalf("nvme manifest: %v", m)
			}
		}
	}
	var want []listedStep
	for step := int64(3); step >= 1; step-- {
		want = append(want, listedStep{"nvme", "a", step})
	}
	for step := int64(300); step >= 1; step-- {
		want = append(want, listedStep{"pfs", "big", step})
	}
	want = append(want, listedStep{"pfs", "small", 7})
	if !slices.Equal(got, want) {
		t.Fatalf("listed %d manifests, want %d: first %v, last %v", len(got), len(want), got[:min(5, len(got))], got[max(0, len(got)-5):])
	}
	sum := pages[len(pages)-1].Listings
	if len(sum) != 2 || sum[0].Tier != "nvme" || sum[0].Manifests != 3 || sum[0].Jobs != 1 ||
		sum[1].Tier != "pfs" || sum[1].Manifests != 301 || sum[1].Skipped != 1 || sum[1].Jobs != 2 || sum[1].Truncated || sum[1].Error != "" ||
		sum[1].Store != pfs.String() {
		t.Fatalf("listings: %v", sum)
	}

	// Bounds: three steps per job, then five manifests in all.
	pages, err = listAll(t, c, &agentpb.TierCopiesRequest{Tiers: []string{"pfs"}, MaxStepsPerJob: 3})
	if err != nil || len(pages) != 1 || len(pages[0].Manifests) != 4 || pages[0].Manifests[0].Step != 300 || !pages[0].Listings[0].Truncated {
		t.Fatalf("three steps per job: %v %v", pages, err)
	}
	pages, err = listAll(t, c, &agentpb.TierCopiesRequest{Tiers: []string{"pfs"}, MaxManifests: 5})
	if err != nil || len(pages) != 1 || len(pages[0].Manifests) != 5 || !pages[0].Listings[0].Truncated || pages[0].Listings[0].Manifests != 5 {
		t.Fatalf("five manifests in all: %v %v", pages, err)
	}
	if _, err := listAll(t, c, &agentpb.TierCopiesRequest{Tiers: []string{"tape"}}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("an unknown tier: %v", err)
	}
	pages, err = listAll(t, c, &agentpb.TierCopiesRequest{Tiers: []string{"s3"}})
	if err != nil || len(pages) != 1 || pages[0].Listings[0].Error == "" {
		t.Fatalf("a tier the node lacks: %v %v", pages, err)
	}
}
