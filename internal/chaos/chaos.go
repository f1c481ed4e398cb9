// Package chaos runs fault scenarios against the compose cluster of
// deploy/compose (a coordinator, four nodes each running its agent and
// the job's ranks, MinIO) and checks after each that the job resumed,
// bit-identical, losing nothing durable and restoring the newest step it
// could. It drives the cluster through the docker-compose and docker
// command lines, the coordinator's gRPC API and the daemons'
// /debug/faults, and reads the ranks' reports from `docker logs`.
package chaos

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Config configures a chaos run.
type Config struct {
	ComposeFile string // deploy/compose/docker-compose.yml
	Project     string // docker-compose project name
	Job         string // the job the compose file's nodes run
	WorldSize   uint32 // its ranks (the compose file starts 3)
	Size        string // state per rank, passed to the cluster (CHAOS_SIZE)
	StepTime    time.Duration
	// Seed drives every random choice (which node, when); 0 picks one.
	// Each scenario draws from its own stream of the seed, so a subset
	// replays the same choices as the whole suite.
	Seed      uint64
	Scenarios []string // names to run; empty: all (or the smoke set)
	Smoke     bool     // only the smoke scenarios
	Keep      bool     // leave the last cluster running, for inspection
	// LogDir, when set, receives the containers' logs of every scenario
	// that fails, in LogDir/seed-N/SCENARIO/SERVICE.log, before its
	// cluster goes.
	LogDir string
	// ScenarioTimeout bounds one scenario, cluster start included;
	// Timeout the whole run (scenarios not started by then are not run).
	ScenarioTimeout time.Duration
	Timeout         time.Duration
	Out             io.Writer
}

// DefaultConfig returns what `make chaos` runs.
func DefaultConfig() Config {
	return Config{
		ComposeFile:     "deploy/compose/docker-compose.yml",
		Project:         "rewindchaos",
		Job:             "chaos",
		WorldSize:       3,
		Size:            "4MiB",                 // a save, a replica and an upload each take milliseconds on 2 cores
		StepTime:        250 * time.Millisecond, // four steps a second: faults land between and inside saves
		ScenarioTimeout: 4 * time.Minute,        // a scenario takes under a minute; the bound catches a hang
		Timeout:         24 * time.Minute,       // with the last scenario's checks and the cleanup, within half an hour
		Out:             os.Stdout,
	}
}

// ErrNoDocker is returned when no Docker engine answers.
var ErrNoDocker = errors.New("chaos: no Docker engine answers")

// Names returns the scenarios' names and what each does.
func Names() [][2]string {
	var out [][2]string
	for _, sc := range scenarios {
		what := sc.what
		if sc.smoke {
			what += " (smoke)"
		}
		out = append(out, [2]string{sc.name, what})
	}
	return out
}

func (c *Config) selected() ([]scenario, error) {
	var out []scenario
	for _, name := range c.Scenarios {
		i := slices.IndexFunc(scenarios, func(sc scenario) bool { return sc.name == name })
		if i < 0 {
			return nil, fmt.Errorf("chaos: no scenario %q; there are: %s", name, strings.Join(names(), ", "))
		}
		out = append(out, scenarios[i])
	}
	if len(c.Scenarios) > 0 {
		return out, nil
	}
	for _, sc := range scenarios {
		if sc.smoke || !c.Smoke {
			out = append(out, sc)
		}
	}
	return out, nil
}

func names() []string {
	var out []string
	for _, sc := range scenarios {
		out = append(out, sc.name)
	}
	return out
}

// Run plays the selected scenarios one after another, each against a
// fresh cluster, prints the table and returns an error when one failed.
func Run(ctx context.Context, cfg Config) error {
	list, err := cfg.selected()
	if err != nil {
		return err
	}
	if _, err := os.Stat(cfg.ComposeFile); err != nil {
		return fmt.Errorf("chaos: compose file: %w", err)
	}
	if err := DockerAnswers(ctx); err != nil {
		return fmt.Errorf("%w: %v", ErrNoDocker, err)
	}
	if cfg.Seed == 0 {
		cfg.Seed = rand.Uint64()>>1 | 1
	}
	fmt.Fprintf(cfg.Out, "rewind-dev chaos: seed %d (replay with --seed %d); %d scenarios\n", cfg.Seed, cfg.Seed, len(list))
	c, err := newCluster(ctx, cfg.ComposeFile, cfg.Project)
	if err != nil {
		return err
	}
	c.Job, c.Size, c.StepTime = cfg.Job, cfg.Size, cfg.StepTime
	var rows []Row
	var failed []string
	start := time.Now()
	runCtx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	for _, sc := range list {
		if runCtx.Err() != nil {
			rows = append(rows, Row{sc.name, "-", "-", "-", "-", "-", "NOT RUN"})
			failed = append(failed, fmt.Sprintf("%s: not run (the run's bound of %v: %v)", sc.name, cfg.Timeout, runCtx.Err()))
			continue
		}
		row, checks := runScenario(runCtx, &cfg, c, sc)
		rows = append(rows, row)
		for _, ch := range checks {
			if !ch.OK {
				failed = append(failed, fmt.Sprintf("%s: %s: %s", sc.name, ch.Name, ch.Detail))
			}
		}
	}
	if cfg.Keep {
		fmt.Fprintf(cfg.Out, "\nthe last cluster is left running (project %s): coordinator gRPC on 127.0.0.1:%d (mutual TLS: --tls-dir %s), metrics on 127.0.0.1:%d, nodes' metrics on %v\n",
			cfg.Project, c.Ports.Coord, filepath.Join(c.Certs, "operator"), c.Ports.CoordMetrics, c.Ports.Nodes)
	} else {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Minute)
		if err := c.Down(dctx); err != nil {
			fmt.Fprintf(cfg.Out, "removing the cluster: %v\n", err)
		}
		cancel()
		c.removeCerts()
	}
	fmt.Fprintf(cfg.Out, "\nseed %d, %d scenarios in %.0f s:\n\n", cfg.Seed, len(rows), time.Since(start).Seconds())
	WriteTable(cfg.Out, rows)
	if len(failed) > 0 {
		fmt.Fprintf(cfg.Out, "\nfailed checks:\n  %s\n", strings.Join(failed, "\n  "))
		return fmt.Errorf("chaos: %d checks failed (seed %d)", len(failed), cfg.Seed)
	}
	return ctx.Err()
}

// scenarioRNG is the scenario's own stream of the seed.
func scenarioRNG(seed uint64, name string) *rand.Rand {
	h := fnv.New64a()
	h.Write([]byte(name))
	return rand.New(rand.NewPCG(seed, h.Sum64()))
}

// runScenario plays one scenario on a fresh cluster and judges it.
func runScenario(ctx context.Context, cfg *Config, c *Cluster, sc scenario) (Row, []Check) {
	ctx, cancel := context.WithTimeout(ctx, cfg.ScenarioTimeout)
	defer cancel()
	s := &session{cfg: cfg, c: c, rng: scenarioRNG(cfg.Seed, sc.name), name: sc.name, t0: time.Now()}
	s.ev.WorldSize, s.ev.Progress = cfg.WorldSize, progressSteps
	fmt.Fprintf(cfg.Out, "\n%s: %s\n", sc.name, sc.what)
	err := c.Up(ctx, cfg.Job)
	if err == nil {
		s.logf("cluster up")
		wctx, stopWatch := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { s.watch(wctx); close(done) }()
		if err = s.warmUp(ctx); err == nil {
			err = sc.play(ctx, s)
		}
		if err == nil {
			err = s.settle(ctx)
		}
		stopWatch()
		<-done
	}
	row, checks := s.finish(ctx, err)
	s.logf("%s", row.Result)
	if cfg.LogDir != "" && slices.ContainsFunc(checks, func(ch Check) bool { return !ch.OK }) {
		dir := filepath.Join(cfg.LogDir, fmt.Sprintf("seed-%d", cfg.Seed), sc.name)
		err := c.SaveLogs(context.WithoutCancel(ctx), dir)
		for svc, b := range s.stacks {
			err = errors.Join(err, os.WriteFile(filepath.Join(dir, svc+".goroutines.txt"), b, 0o644))
		}
		if err != nil {
			s.logf("saving the cluster's logs: %v", err)
		} else {
			s.logf("the cluster's logs are in %s", dir)
		}
	}
	return row, checks
}
