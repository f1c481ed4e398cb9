package main

import (
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"rewind.dev/rewind/membership"
	"rewind.dev/rewind/transport"
)

// gossipFlags configure failure detection (membership) on a daemon.
type gossipFlags struct {
	bind  string
	join  string
	keys  string
	label string
}

func (g *gossipFlags) register(fs *flag.FlagSet, defaultBind, joinHelp string) {
	fs.StringVar(&g.bind, "gossip", defaultBind, "address:port for failure detection (memberlist, UDP and TCP); empty turns it off")
	if joinHelp != "" {
		fs.StringVar(&g.join, "gossip-join", "", joinHelp)
	}
	fs.StringVar(&g.keys, "gossip-keys", "", "file of gossip encryption keys, one base64 key a line, the first encrypting (rewind certs writes one; "+
		"read again when it changes); default: "+membership.KeyFileName+" in --tls-dir when it is there. None: plaintext gossip")
	fs.StringVar(&g.label, "gossip-label", membership.DefaultConfig().Label, "the cluster's name in every gossip message: members with another label ignore each other")
}

// config returns the membership configuration, or nil when off. Its keys
// come from --gossip-keys, or the key file in tlsDir; without keys gossip
// is plaintext, which log is told loudly when the member listens beyond
// loopback.
func (g *gossipFlags) config(tlsDir string, log *slog.Logger) (*membership.Config, error) {
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
	cfg.Label = g.label
	keyFile := g.keys
	if keyFile == "" && tlsDir != "" {
		if _, err := os.Stat(filepath.Join(tlsDir, membership.KeyFileName)); err == nil {
			keyFile = filepath.Join(tlsDir, membership.KeyFileName)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("gossip keys: %w", err)
		}
	}
	if keyFile != "" {
		if cfg.Keys, err = membership.ReadKeyFile(keyFile); err != nil {
			return nil, err
		}
		cfg.KeyFile = keyFile
	} else if !transport.IsLoopback(net.JoinHostPort(cfg.BindAddr, port)) {
		log.Error("gossip runs in plaintext, unauthenticated: anyone on the network can read it and join the cluster's failure detection; "+
			"pass --gossip-keys FILE (rewind certs writes "+membership.KeyFileName+")", "addr", g.bind)
	}
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

// daemonRegistry is the registry a daemon serves on its --metrics
// address. Failure detection's metrics (rewind_membership_*) go on it
// too: a membership.Config without a Registry keeps them in one of its
// own, which nothing serves.
func daemonRegistry(gossip *membership.Config) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	if gossip != nil {
		gossip.Registry = reg
	}
	return reg
}
