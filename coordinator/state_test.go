package coordinator

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
)

// TestStateMachine runs the commit state machine through the scenarios in
// testdata/state/*. Commands:
//
//	register job=J ws=N [place=RANK:NODE,...]
//	commit job=J step=S ranks=A[-B][,C] [ws=N] [node=X] [sum=H] [tier=T]  (node defaults to n<rank>; "-" is a shared tier's)
//	remove job=J step=S rank=R [node=X] [state=deleted|corrupt] [tier=T]
//	reconcile node=X have=STEP,...   (rank 0's inventory on node X)
//	show job=J
func TestStateMachine(t *testing.T) {
	datadriven.Walk(t, "testdata/state", func(t *testing.T, path string) {
		clock := time.Unix(1_800_000_000, 0)
		s := NewState(func() time.Time { clock = clock.Add(time.Millisecond); return clock })
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			return runStateCmd(t, s, d)
		})
	})
}

func arg(d *datadriven.TestData, key, def string) string {
	for _, a := range d.CmdArgs {
		if a.Key == key {
			return strings.Join(a.Vals, ",")
		}
	}
	return def
}

func num(t *testing.T, d *datadriven.TestData, key, def string) int64 {
	v, err := strconv.ParseInt(arg(d, key, def), 10, 64)
	if err != nil {
		d.Fatalf(t, "%s: %v", key, err)
	}
	return v
}

func ranks(t *testing.T, d *datadriven.TestData) []uint32 {
	var out []uint32
	for _, part := range strings.Split(arg(d, "ranks", arg(d, "rank", "")), ",") {
		lo, hi, ok := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			d.Fatalf(t, "ranks: %v", err)
		}
		b := a
		if ok {
			if b, err = strconv.Atoi(hi); err != nil {
				d.Fatalf(t, "ranks: %v", err)
			}
		}
		for r := a; r <= b; r++ {
			out = append(out, uint32(r))
		}
	}
	return out
}

func runStateCmd(t *testing.T, s *State, d *datadriven.TestData) string {
	job := arg(d, "job", "j")
	var ch Changes
	var out []string
	switch d.Cmd {
	case "register":
		place := map[uint32]string{}
		if p := arg(d, "place", ""); p != "" {
			for _, kv := range strings.Split(p, ",") {
				r, n, _ := strings.Cut(kv, ":")
				ri, _ := strconv.Atoi(r)
				place[uint32(ri)] = n
			}
		}
		re, err := s.RegisterJob(job, uint32(num(t, d, "ws", "0")), place, &ch)
		if err != nil {
			return "error: " + err.Error()
		}
		out = append(out, fmt.Sprintf("registered %s ws=%d reregistered=%v", job, s.Jobs[job].WorldSize, re))
	case "commit", "remove":
		state := "committed"
		if d.Cmd == "remove" {
			state = arg(d, "state", "deleted")
		}
		for _, r := range ranks(t, d) {
			rec := Record{Job: job, Step: num(t, d, "step", "0"), Rank: r, WorldSize: uint32(num(t, d, "ws", wsOf(s, job))),
				Node: arg(d, "node", fmt.Sprintf("n%d", r)), Tier: arg(d, "tier", ""), Size: 100, Sum: arg(d, "sum", "s"), State: CopyState(state)}
			if err := s.Apply(rec, &ch); err != nil {
				out = append(out, fmt.Sprintf("rank %d: error: %v", r, err))
			}
		}
	case "reconcile":
		var inv []Record
		for _, sr := range strings.Split(arg(d, "have", ""), ",") {
			if sr == "" {
				continue
			}
			step, _ := strconv.ParseInt(sr, 10, 64)
			inv = append(inv, Record{Job: job, Step: step, Rank: 0})
		}
		s.Reconcile(arg(d, "node", ""), inv, &ch)
	case "show":
	default:
		d.Fatalf(t, "unknown command %s", d.Cmd)
	}
	for _, k := range ch.Consistent {
		out = append(out, fmt.Sprintf("step %d consistent", k.Step))
	}
	if ch.Sync {
		out = append(out, "sync")
	}
	if j := s.Jobs[job]; j != nil {
		out = append(out, showJob(j))
	}
	return strings.Join(out, "\n") + "\n"
}

func wsOf(s *State, job string) string {
	if j := s.Jobs[job]; j != nil {
		return strconv.Itoa(int(j.WorldSize))
	}
	return "1"
}

func showJob(j *Job) string {
	var b strings.Builder
	fmt.Fprintf(&b, "job %s ws=%d latest=%d", j.ID, j.WorldSize, j.Latest)
	if j.Protected >= 0 {
		fmt.Fprintf(&b, " protected=%d", j.Protected)
	}
	for _, st := range j.SortedSteps() {
		var rs []string
		for r, cs := range st.Copies {
			for _, c := range cs {
				rs = append(rs, fmt.Sprintf("%d@%s", r, c.Node))
			}
		}
		sort.Strings(rs)
		fmt.Fprintf(&b, "\n  step %d ws=%d %s ranks=%d/%d [%s]", st.Step, st.WorldSize, st.State, len(st.Copies), st.WorldSize, strings.Join(rs, " "))
		var bad []string
		for r, cs := range st.Bad {
			for _, c := range cs {
				bad = append(bad, fmt.Sprintf("%d@%s:%s", r, c.Tier, c.Node))
			}
		}
		if sort.Strings(bad); len(bad) > 0 {
			fmt.Fprintf(&b, " corrupt=[%s]", strings.Join(bad, " "))
		}
		if st.Unrestorable != nil {
			fmt.Fprintf(&b, " unrestorable=(%s)", st.Unrestorable)
		}
	}
	return b.String()
}
