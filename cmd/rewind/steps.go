package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"rewind.dev/rewind/api/coordpb"
)

// tickEvery is how often a terminal's progress line moves while one
// call to the coordinator runs.
const tickEvery = 200 * time.Millisecond

// stepSpec is a STEP argument: one step, or FIRST-LAST (inclusive).
type stepSpec struct{ first, last int64 }

func parseStepSpec(s string) (stepSpec, error) {
	a, b, isRange := strings.Cut(s, "-")
	first, err := parseStep(a)
	if err != nil || !isRange {
		return stepSpec{first, first}, err
	}
	last, err := parseStep(b)
	if err != nil {
		return stepSpec{}, err
	}
	if last < first {
		return stepSpec{}, fmt.Errorf("step range %q ends before it starts", s)
	}
	return stepSpec{first, last}, nil
}

// jobSteps returns the JOB STEP [STEP...] positional arguments of a
// command.
func (o opFlags) jobSteps() (string, []stepSpec, error) {
	if o.fs.NArg() < 2 {
		return "", nil, usageError(o.fs, errors.New("need JOB and STEP (N, or FIRST-LAST; several may be given)"))
	}
	var specs []stepSpec
	for _, a := range o.fs.Args()[1:] {
		sp, err := parseStepSpec(a)
		if err != nil {
			return "", nil, err
		}
		specs = append(specs, sp)
	}
	return o.fs.Arg(0), specs, nil
}

// resolveSteps returns the steps the specs name, in order, each with its
// bytes (its copies' sizes, none found corrupt; 0 when the coordinator
// does not list it). A single step is kept even when not listed, so that
// the coordinator's answer says why; a range keeps only listed steps.
func resolveSteps(ctx context.Context, c coordpb.CoordinatorClient, job string, specs []stepSpec) ([]int64, []uint64, error) {
	listed, err := listSteps(ctx, c, job)
	if err != nil {
		return nil, nil, err
	}
	size := map[int64]uint64{}
	for _, st := range listed {
		size[st.Step] = summaryOf(st).Bytes
	}
	var steps []int64
	var sizes []uint64
	seen := map[int64]bool{}
	add := func(s int64) {
		if !seen[s] {
			seen[s] = true
			steps, sizes = append(steps, s), append(sizes, size[s])
		}
	}
	for _, sp := range specs {
		if sp.first == sp.last {
			add(sp.first)
			continue
		}
		for _, st := range listed {
			if st.Step >= sp.first && st.Step <= sp.last {
				add(st.Step)
			}
		}
	}
	if len(steps) == 0 {
		return nil, nil, fmt.Errorf("job %s has no step in the ranges given", job)
	}
	return steps, sizes, nil
}

func sum(xs []uint64) uint64 {
	var n uint64
	for _, x := range xs {
		n += x
	}
	return n
}
