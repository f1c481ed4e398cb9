package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/internal/units"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
)

func runInspect(ctx context.Context, args []string) error {
	o := newOpFlags("inspect", "inspect [flags] JOB STEP | FILE | --job J --rank R [--step S]")
	fs := o.fs
	socket := fs.String("socket", "", "agent socket, to inspect by --job/--rank")
	job := fs.String("job", "", "job of the shard to inspect (instead of a file)")
	rank := fs.Uint("rank", 0, "rank of the shard")
	step := fs.Int64("step", -1, "step of the shard (default: latest)")
	verify := fs.Bool("verify", false, "also check every tensor's checksum")
	asJSON := o.asJSON
	if err := o.parse(args); err != nil {
		return err
	}
	if fs.NArg() == 2 {
		step, err := parseStep(fs.Arg(1))
		if err != nil {
			return err
		}
		return inspectStep(ctx, o, fs.Arg(0), step)
	}
	path := fs.Arg(0)
	if *job != "" {
		c, err := sdk.Dial(ctx, *socket)
		if err != nil {
			return err
		}
		defer c.Close()
		shards, err := c.List(ctx, *job)
		if err != nil {
			return err
		}
		var best uint64
		for _, s := range shards {
			if s.Rank == uint32(*rank) && (s.State == agentpb.ShardState_SHARD_STATE_COMMITTED || s.State == agentpb.ShardState_SHARD_STATE_CORRUPT) && (*step < 0 && s.Seq > best || s.Step == *step) {
				path, best = s.Path, s.Seq
			}
		}
		if path == "" {
			return fmt.Errorf("no shard of job %s rank %d%s on this node", *job, *rank, map[bool]string{true: "", false: fmt.Sprintf(" at step %d", *step)}[*step < 0])
		}
	}
	if path == "" {
		return usageError(fs, errors.New("no shard file given"))
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	h, err := shm.DecodeBytes(data)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	var verr error
	if *verify {
		verr = h.Verify(data, 0)
	}
	if *asJSON {
		return printJSONHeader(h, verr)
	}
	printHeader(path, h)
	if *verify {
		if verr != nil {
			return verr
		}
		fmt.Println("\nverify: every checksum matches")
	}
	return nil
}

func printHeader(path string, h *shm.Header) {
	fmt.Printf("%s: %s, %d tensors, data at offset %d\n", path, units.Bytes(uint64(h.Size)), len(h.Tensors), h.DataStart)
	if h.Rewind {
		fmt.Printf("job %s  rank %d of %d  step %d  checksum %s\n", h.Meta.Job, h.Meta.Rank, h.Meta.WorldSize, h.Meta.Step, shm.ChecksumAlgo)
	} else {
		fmt.Println("a plain safetensors file (no rewind metadata)")
	}
	if len(h.Objects) > 0 {
		o := string(h.Objects)
		if len(o) > 200 {
			o = o[:200] + "..."
		}
		fmt.Printf("objects: %s\n", o)
	}
	fmt.Println()
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENSOR\tDTYPE\tSHAPE\tBYTES\tOFFSETS\tCHECKSUM")
	for _, t := range h.Tensors {
		sum := "-"
		if t.HasSum {
			sum = shm.FormatSum(t.Sum)
		}
		shape := strings.Trim(strings.ReplaceAll(fmt.Sprint(t.Shape), " ", ","), "[]")
		fmt.Fprintf(tw, "%s\t%s\t[%s]\t%d\t[%d,%d]\t%s\n", t.Name, t.DType, shape, t.Len(), t.Begin, t.End, sum)
	}
	tw.Flush()
}

func printJSONHeader(h *shm.Header, verr error) error {
	type tensor struct {
		Name     string     `json:"name"`
		DType    shm.DType  `json:"dtype"`
		Shape    []int64    `json:"shape"`
		Offsets  [2]int64   `json:"data_offsets"`
		Checksum string     `json:"checksum,omitempty"`
		Chunk    *shm.Chunk `json:"chunk,omitempty"`
	}
	out := map[string]any{"size": h.Size, "data_start": h.DataStart, "metadata": h.Metadata}
	if h.Rewind {
		out["job"], out["rank"], out["world_size"], out["step"] = h.Meta.Job, h.Meta.Rank, h.Meta.WorldSize, h.Meta.Step
	}
	var ts []tensor
	for _, t := range h.Tensors {
		x := tensor{Name: t.Name, DType: t.DType, Shape: t.Shape, Offsets: [2]int64{t.Begin, t.End}, Chunk: t.Chunk}
		if t.HasSum {
			x.Checksum = shm.FormatSum(t.Sum)
		}
		ts = append(ts, x)
	}
	out["tensors"] = ts
	if verr != nil {
		out["verify_error"] = verr.Error()
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		return err
	}
	return verr
}
