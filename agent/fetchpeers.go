package agent

import (
	"context"
	"fmt"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/shm"
	"rewind.dev/rewind/tiers"
	"rewind.dev/rewind/transport"
)

// maxFetchSources bounds the sources of one Fetch: a plan names each copy
// of the shard once, and a shard has at most the coordinator's
// --max-copies-per-shard (64).
const maxFetchSources = 64

// validateFetchSources checks a Fetch's sources before any is tried:
// their count, each tier's name ("shm" or a durable tier), each node's
// name ("-" on a shared tier). A source of another node's memory with no
// address is left to fail on its own, as one that cannot serve.
func validateFetchSources(srcs []Source) error {
	if len(srcs) > maxFetchSources {
		return fmt.Errorf("%w: agent: Fetch names %d sources, at most %d", ErrInvalid, len(srcs), maxFetchSources)
	}
	for i, s := range srcs {
		switch {
		case s.Tier != "shm" && !tiers.Name(s.Tier).Valid():
			return fmt.Errorf("%w: agent: Fetch source %d: unknown tier %q (want shm, %v)", ErrInvalid, i, s.Tier, tiers.Names())
		case s.Node != "-" && s.Node != "":
			if err := shm.ValidateNode(s.Node); err != nil {
				return fmt.Errorf("%w: agent: Fetch source %d: %v", ErrInvalid, i, err)
			}
		}
	}
	return nil
}

// checkFetchPeers refuses a Fetch that would dial a peer the coordinator
// does not know at that address: Fetch takes its sources from its
// caller, and an agent must not be made to connect wherever a caller
// says. The coordinator, known by its certificate, is believed: its
// sources come from its index of registered nodes. Any other caller (a
// process on the node's socket, a plaintext connection) has each peer
// checked against the coordinator's registrations (its Nodes call).
func (a *Agent) checkFetchPeers(ctx context.Context, srcs []Source) error {
	if err := validateFetchSources(srcs); err != nil {
		return err
	}
	if p := transport.CallerOf(ctx); p.Kind == transport.PeerTLS && p.Err == nil && p.Identity.Role == transport.RoleCoordinator {
		return nil
	}
	var names []string
	for _, s := range srcs {
		if dials(s, a.cfg.Node) {
			names = append(names, s.Node)
		}
	}
	if len(names) == 0 {
		return nil
	}
	if a.rep == nil {
		return fmt.Errorf("%w: agent: Fetch from node %s refused: this agent has no coordinator to know its peers from", ErrUnknownPeer, names[0])
	}
	resp, err := a.rep.c.Nodes(ctx, &coordpb.NodesRequest{Names: names})
	if err != nil {
		return fmt.Errorf("agent: asking the coordinator which nodes it knows, to check a Fetch: %w", err)
	}
	known := make(map[string]string, len(resp.Nodes))
	for _, n := range resp.Nodes {
		known[n.Name] = n.Addr
	}
	for _, s := range srcs {
		if !dials(s, a.cfg.Node) {
			continue
		}
		if addr, ok := known[s.Node]; !ok {
			return fmt.Errorf("%w: agent: Fetch may dial only nodes the coordinator knows; it knows no node %q (asked to dial %s)", ErrUnknownPeer, s.Node, s.Addr)
		} else if addr != s.Addr {
			return fmt.Errorf("%w: agent: Fetch may dial only nodes the coordinator knows; node %q is at %s, not %s", ErrUnknownPeer, s.Node, addr, s.Addr)
		}
	}
	return nil
}

// dials reports whether fetching from s dials another node: its memory,
// at an address.
func dials(s Source, self string) bool { return s.Tier == "shm" && s.Node != self && s.Addr != "" }
