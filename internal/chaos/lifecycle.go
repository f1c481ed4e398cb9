package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/clock"
	"rewind.dev/rewind/internal/freeport"
)

// DockerAnswers reports whether a Docker engine answers (`docker info`),
// and why not.
func DockerAnswers(ctx context.Context) error {
	_, err := run(ctx, 20*time.Second, nil, "docker", "info", "--format", "{{.ServerVersion}}")
	return err
}

// newCluster prepares a cluster: free host ports and a free /24.
func newCluster(ctx context.Context, file, project string) (*Cluster, error) {
	c := &Cluster{File: file, Project: project, Ports: Ports{Nodes: map[string]int{}}}
	var err error
	if c.Net, err = freeSubnet(ctx); err != nil {
		return nil, err
	}
	ports, err := freeport.Ports(2 + len(nodeServices))
	if err != nil {
		return nil, err
	}
	c.Ports.Coord, c.Ports.CoordMetrics = ports[0], ports[1]
	for i, n := range nodeServices {
		c.Ports.Nodes[n] = ports[2+i]
	}
	if err := c.makeCerts(); err != nil {
		return nil, err
	}
	return c, nil
}

// freeSubnet picks a /24 that no Docker network uses yet.
func freeSubnet(ctx context.Context) (string, error) {
	ids, err := run(ctx, 20*time.Second, nil, "docker", "network", "ls", "-q")
	if err != nil {
		return "", err
	}
	used := ""
	if f := strings.Fields(string(ids)); len(f) > 0 {
		out, err := run(ctx, 20*time.Second, nil, "docker", append([]string{"network", "inspect", "-f",
			"{{range .IPAM.Config}}{{.Subnet}} {{end}}"}, f...)...)
		if err != nil {
			return "", err
		}
		used = string(out)
	}
	return pickSubnet(used)
}

// pickSubnet returns the first candidate /24 (as its first three bytes)
// that does not appear in used (docker's subnets, space separated).
func pickSubnet(used string) (string, error) {
	for third := 240; third < 256; third++ {
		prefix := fmt.Sprintf("172.31.%d", third)
		if !strings.Contains(used, prefix+".") {
			return prefix, nil
		}
	}
	return "", fmt.Errorf("chaos: every subnet 172.31.240.0/24 to 172.31.255.0/24 is taken by a Docker network")
}

// Up starts a fresh cluster (a previous one of the project is removed
// with its volumes first) and waits until the job trains: the
// coordinator answers, every node's agent is connected, and a step is
// consistent.
func (c *Cluster) Up(ctx context.Context, job string) error {
	if err := c.Down(ctx); err != nil {
		return err
	}
	if err := c.upOnFreeSubnet(ctx); err != nil {
		return err
	}
	c.ids = map[string]string{}
	for _, svc := range append([]string{svcCoordinator, svcMinIO}, nodeServices...) {
		out, err := c.compose(ctx, 30*time.Second, "ps", "-q", svc)
		if err != nil {
			return err
		}
		if c.ids[svc] = strings.TrimSpace(string(out)); c.ids[svc] == "" {
			return fmt.Errorf("chaos: compose started no container for %s", svc)
		}
	}
	if err := c.dial(); err != nil {
		return err
	}
	return c.waitReady(ctx, job, 2*time.Minute)
}

// upOnFreeSubnet starts the project's containers. The /24 picked when the
// cluster was prepared is free no longer when another runner on the same
// engine took it while this one's network was down between scenarios
// (docker: "Pool overlaps"): a free one is picked again, three times at
// most.
func (c *Cluster) upOnFreeSubnet(ctx context.Context) error {
	for try := 1; ; try++ {
		_, err := c.compose(ctx, 3*time.Minute, "up", "-d", "--no-build")
		if err == nil || try == 3 || !strings.Contains(err.Error(), "Pool overlaps") {
			return err
		}
		if derr := c.Down(ctx); derr != nil {
			return fmt.Errorf("%w (and removing the half-started cluster: %v)", err, derr)
		}
		if c.Net, err = freeSubnet(ctx); err != nil {
			return err
		}
	}
}

func (c *Cluster) waitReady(ctx context.Context, job string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var why string
	for {
		why = c.notReady(ctx, job)
		if why == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("chaos: the cluster was not ready within %v: %s", timeout, why)
		}
		if clock.Sleep(ctx, 500*time.Millisecond) != nil {
			return ctx.Err()
		}
	}
}

// notReady says what the cluster still lacks; empty when ready.
func (c *Cluster) notReady(ctx context.Context, job string) string {
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	ts, err := c.API.TierStatus(cctx, &coordpb.TierStatusRequest{})
	if err != nil {
		return "the coordinator does not answer: " + err.Error()
	}
	if len(ts.Nodes) < len(nodeServices) {
		return fmt.Sprintf("%d of %d agents connected", len(ts.Nodes), len(nodeServices))
	}
	jobs, err := c.API.ListJobs(cctx, &coordpb.ListJobsRequest{Job: job, View: coordpb.JobView_JOB_VIEW_SUMMARY})
	if err != nil {
		return err.Error()
	}
	for _, j := range jobs.Jobs {
		if j.Id == job && j.LatestConsistent >= 1 {
			return ""
		}
	}
	return "job " + job + " has no consistent step yet"
}

// Down removes the cluster: containers, network and volumes.
func (c *Cluster) Down(ctx context.Context) error {
	c.Close()
	_, err := c.compose(ctx, 3*time.Minute, "down", "--volumes", "--remove-orphans", "--timeout", "1")
	return err
}

// parseHits reads a point's hit count from GET /debug/faults.
func parseHits(body []byte, point string) (uint64, error) {
	var st struct {
		Points []struct {
			Name string `json:"name"`
			Hits uint64 `json:"hits"`
		} `json:"points"`
	}
	if err := json.Unmarshal(body, &st); err != nil {
		return 0, fmt.Errorf("chaos: /debug/faults answer: %w", err)
	}
	for _, p := range st.Points {
		if p.Name == point {
			return p.Hits, nil
		}
	}
	return 0, fmt.Errorf("chaos: /debug/faults has no point %s", point)
}
