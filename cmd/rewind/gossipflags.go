package main

import (
	"flag"
	"fmt"
	"net"
	"strconv"
	"strings"

	"rewind.dev/rewind/membership"
)

// gossipFlags configure failure detection (membership) on a daemon.
type gossipFlags struct {
	bind string
	join string
}

func (g *gossipFlags) register(fs *flag.FlagSet, defaultBind, joinHelp string) {
	fs.StringVar(&g.bind, "gossip", defaultBind, "address:port for failure detection (memberlist, UDP and TCP); empty turns it off")
	if joinHelp != "" {
		fs.StringVar(&g.join, "gossip-join", "", joinHelp)
	}
}

// config returns the membership configuration, or nil when off.
func (g *gossipFlags) config() (*membership.Config, error) {
	if g.bind == "" {
		return nil, nil
	}
	host, port, err := net.SplitHostPort(g.bind)
	if err != nil {
		return nil, fmt.Errorf("--gossip %q: %w", g.bind, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return nil, fmt.Errorf("--gossip %q: bad port", g.bind)
	}
	cfg := membership.DefaultConfig()
	if host != "" {
		cfg.BindAddr = host
	}
	cfg.BindPort = p
	return &cfg, nil
}

// seeds returns the members to join: --gossip-join, or the coordinator's
// host on the coordinator's default gossip port.
func (g *gossipFlags) seeds(coordinator string) []string {
	if g.join != "" {
		return strings.Split(g.join, ",")
	}
	if host, _, err := net.SplitHostPort(coordinator); err == nil && coordinator != "" {
		return []string{net.JoinHostPort(host, "7947")}
	}
	return nil
}
