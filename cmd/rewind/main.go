// Command rewind is the one binary of rewind: the node agent, operator
// commands, the demo and the benchmarks. main only wires.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

type command struct {
	name  string
	usage string
	run   func(ctx context.Context, args []string) error
}

var commands = []command{
	{"agent", "run the node agent", runAgent},
	{"coordinator", "run the cluster coordinator", runCoordinator},
	{"ls", "list jobs and checkpoints (of the coordinator, or of one agent with --socket)", runLs},
	{"inspect", "print a step (JOB STEP) or a shard file's header", runInspect},
	{"verify", "re-read and check every copy of a step (JOB STEP)", runVerify},
	{"restore", "restore a job from the nearest copies and restart it there, or print the plan (JOB [--step S] [--dry-run] [--force] [--no-restart])", runRestore},
	{"delete", "delete a step's copies (JOB STEP [--force])", runDelete},
	{"tiers", "show each agent's durable tiers: transfers, throughput, failures", runTiers},
	{"policy", "show or set a job's tier policy (JOB [POLICY])", runPolicy},
	{"bench", "measure performance (bench save|coordinator|tiers|recovery)", runBench},
	{"demo", "run a local cluster and a training job; a node dies and the job recovers", runDemo},
	{"demo-train", "", runDemoTrain}, // the demo's training process
	{"node", "run a node of the compose cluster: the agent and the job's ranks placed on it", runNode},
	{"chaos", "run fault scenarios against the compose cluster (deploy/compose)", runChaos},
	{"chaos-tool", "", runChaosTool}, // the chaos runner's helper inside the cluster's containers
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	for _, c := range commands {
		if c.name == os.Args[1] {
			if err := c.run(ctx, os.Args[2:]); err != nil {
				fmt.Fprintln(os.Stderr, "rewind "+c.name+":", err)
				os.Exit(1)
			}
			return
		}
	}
	usage()
	os.Exit(2)
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: rewind COMMAND [flags]\n\ncommands:")
	for _, c := range commands {
		if c.usage != "" {
			fmt.Fprintf(os.Stderr, "  %-12s %s\n", c.name, c.usage)
		}
	}
	fmt.Fprintln(os.Stderr, "\nrewind COMMAND -h shows a command's flags.")
}
