// Command rewind-dev is rewind's harness, kept apart from the product an
// operator installs (cmd/rewind): the demo, the benchmarks and the chaos
// runner. The processes they start run the rewind binary found beside
// this one (make build puts both in bin/). main only wires.
package main

import "rewind.dev/rewind/internal/cli"

var commands = []cli.Command{
	{Name: "demo", Usage: "run a local cluster and a training job; a node dies and the job recovers", Run: runDemo},
	{Name: "demo-train", Usage: "", Run: runDemoTrain}, // the demo's training process, also the ranks of `rewind node`
	{Name: "bench", Usage: "measure performance (bench save|coordinator|tiers|recovery|peer|goodput)", Run: runBench},
	{Name: "chaos", Usage: "run fault scenarios against the compose cluster (deploy/compose)", Run: runChaos},
	{Name: "chaos-tool", Usage: "", Run: runChaosTool}, // the chaos runner's helper inside the cluster's containers
}

func main() { cli.Main("rewind-dev", commands) }
