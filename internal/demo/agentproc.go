package demo

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"

	"rewind.dev/rewind/internal/child"
	"rewind.dev/rewind/internal/units"
	"rewind.dev/rewind/sdk"
)

// agentReadyTimeout bounds how long a started agent may take to answer.
const agentReadyTimeout = 10 * time.Second

// startAgent starts `rewind agent` on the demo's shm root and socket, its
// log appended to the demo's agent log, and waits until it answers.
func (d *demo) startAgent(ctx context.Context) error {
	f, err := os.OpenFile(d.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("demo: agent log: %w", err)
	}
	args := []string{"agent", "--node", "demo-node", "--shm-root", d.shmRoot, "--socket", d.socket,
		"--listen", "", "--metrics", "127.0.0.1:0"}
	p, err := startProc("agent", d.rewind, args, f, f)
	f.Close() // the agent has its own descriptor
	if err != nil {
		return err
	}
	d.agent = p
	d.procs = append(d.procs, p)
	d.tl.log("agent", "started: pid %d, log %s", p.Pid(), d.logPath)
	t0 := time.Now()
	c, err := d.waitAgent(ctx, p)
	if err != nil {
		return err
	}
	d.client = c
	st, err := c.Status(ctx)
	if err != nil {
		return err
	}
	metrics := ""
	if m := d.agentLog(`msg="agent serving"`); len(m) > 0 {
		if addr := regexp.MustCompile(`metrics=(\S+)`).FindStringSubmatch(m[len(m)-1]); addr != nil {
			metrics = fmt.Sprintf(", metrics on http://%s/metrics", addr[1])
		}
	}
	d.tl.log("agent", "ready in %s ms: node %s, %s %s free%s", ms(time.Since(t0)), st.Node, st.Filesystem, units.Bytes(st.FsFreeBytes), metrics)
	return nil
}

// waitAgent dials the agent until it answers, it exits, or
// agentReadyTimeout passes.
func (d *demo) waitAgent(ctx context.Context, p *child.Proc) (*sdk.Client, error) {
	var c *sdk.Client
	err := p.Ready(ctx, agentReadyTimeout, func() error {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		var err error
		c, err = sdk.Dial(cctx, d.socket)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("demo: no agent answered on %s: %w; its log is %s", d.socket, err, d.logPath)
	}
	return c, nil
}

// agentLog returns the lines of the agent log, from its latest start on,
// that contain substr (every line when substr is empty).
func (d *demo) agentLog(substr string) []string {
	f, err := os.Open(d.logPath)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if strings.Contains(l, `msg=pre-flight`) {
			out = out[:0] // a new start
		}
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return out
}

// logNoise matches the parts of an agent log line that say nothing here.
var logNoise = regexp.MustCompile(`^time=\S+ |level=INFO | component=\S+| node=\S+`)

// showReindex prints what the restarted agent logged about re-indexing.
func (d *demo) showReindex() {
	for _, l := range d.agentLog("re-index") {
		d.tl.log("agent", "log: %s", logNoise.ReplaceAllString(l, ""))
	}
}

// listShards prints what the agent holds for the job.
func (d *demo) listShards(ctx context.Context) error {
	shards, err := d.client.List(ctx, jobName)
	if err != nil {
		return err
	}
	d.tl.log("agent", "holds %d shard(s) of job %s (rewind ls):", len(shards), jobName)
	for _, s := range shards {
		state := s.State.Label()
		if s.Problem != "" {
			state += " (" + s.Problem + ")"
		}
		d.tl.plain("%s   rank %d  step %-4d %-10s verified=%-5v %s  slot %d", indent, s.Rank, s.Step, state, s.Verified, units.Bytes(s.SizeBytes), s.Slot)
	}
	return nil
}
