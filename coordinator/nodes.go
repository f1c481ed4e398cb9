package coordinator

import (
	"context"
	"fmt"

	"rewind.dev/rewind/api/coordpb"
)

// maxNodesAsked bounds the names of one Nodes call (DESIGN invariant 10).
const maxNodesAsked = 4096

// Nodes answers the registered nodes among those asked.
func (s *server) Nodes(_ context.Context, req *coordpb.NodesRequest) (*coordpb.NodesResponse, error) {
	if len(req.Names) > maxNodesAsked {
		return nil, toStatus(fmt.Errorf("%w: coordinator: nodes: %d names asked, at most %d", ErrInvalid, len(req.Names), maxNodesAsked))
	}
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	resp := &coordpb.NodesResponse{}
	add := func(n *NodeInfo) {
		resp.Nodes = append(resp.Nodes, &coordpb.Node{Name: n.Name, Addr: n.Addr, FailureDomain: n.FailureDomain, ShmBudgetBytes: n.BudgetBytes})
	}
	if len(req.Names) == 0 {
		for _, n := range s.c.state.Nodes {
			add(n)
		}
		return resp, nil
	}
	for _, name := range req.Names {
		if n := s.c.state.Nodes[name]; n != nil {
			add(n)
		}
	}
	return resp, nil
}
