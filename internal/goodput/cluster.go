package goodput

import (
	"context"
	"fmt"

	"rewind.dev/rewind/internal/localcluster"
)

// cluster is the local cluster of one configuration's run: MinIO (when
// built), a coordinator and agents with fault injection on, in
// plaintext on loopback.
type cluster struct {
	*localcluster.Cluster
	gen int // replacement nodes started
}

// agentFlags are every agent's flags beyond localcluster's: the
// benchmark arms its faults through each agent's endpoint.
var agentFlags = []string{"--fault-injection"}

// tierPolicy is the tier policy: durable copies every few steps, on S3
// when there is an object store.
func tierPolicy(s3 bool) string {
	p := "nvme:every=5,keep=2;pfs:every=10,keep=2"
	if s3 {
		p += ";s3:every=30,keep=2"
	}
	return p
}

// startCluster starts MinIO, the coordinator and n agents, the nodes'
// shm roots under shmParent; on an error it stops what it started.
func startCluster(ctx context.Context, rewind, shmParent string, n int, noMinIO bool) (_ *cluster, err error) {
	lc, err := localcluster.New(localcluster.Options{Rewind: rewind, Name: "goodput", ShmDir: shmParent, MinIO: !noMinIO})
	c := &cluster{Cluster: lc}
	defer func() {
		if err != nil {
			c.Close(false)
		}
	}()
	if err != nil {
		return nil, err
	}
	if err := c.StartCoordinator(ctx, tierPolicy(c.MinIO != nil), nil); err != nil {
		return nil, err
	}
	for i := range n {
		nd := c.NewNode(fmt.Sprintf("node-%d", i), fmt.Sprintf("rack-%c", 'a'+i%2), true)
		c.Nodes = append(c.Nodes, nd)
		if err := c.StartAgent(ctx, nd, agentFlags, nil); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// replace starts a new node in place of the i-th (lost) one: a new name,
// new addresses, an empty shm root, the same failure domain.
func (c *cluster) replace(ctx context.Context, i int) (*localcluster.Node, error) {
	c.gen++
	n := c.NewNode(fmt.Sprintf("node-%d-r%d", i, c.gen), c.Nodes[i].Domain, true)
	c.Nodes[i] = n
	return n, c.StartAgent(ctx, n, agentFlags, nil)
}
