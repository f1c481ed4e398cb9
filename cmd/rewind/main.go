// Command rewind is what an operator installs: the node agent, the
// coordinator, a compose cluster's node, and the operator commands. The
// demo, the benchmarks and the chaos runner are in cmd/rewind-dev. main
// only wires.
package main

import "rewind.dev/rewind/internal/cli"

var commands = []cli.Command{
	{Name: "agent", Usage: "run the node agent", Run: runAgent},
	{Name: "coordinator", Usage: "run the cluster coordinator", Run: runCoordinator},
	{Name: "ls", Usage: "list jobs and checkpoints (of the coordinator, or of one agent with --socket)", Run: runLs},
	{Name: "inspect", Usage: "print a step (JOB STEP) or a shard file's header", Run: runInspect},
	{Name: "verify", Usage: "re-read and check every copy of a step (JOB STEP)", Run: runVerify},
	{Name: "restore", Usage: "restore a job from the nearest copies and restart it there, or print the plan (JOB [--step S] [--dry-run] [--force] [--no-restart])", Run: runRestore},
	{Name: "delete", Usage: "delete a step's copies (JOB STEP [--force])", Run: runDelete},
	{Name: "tiers", Usage: "show each agent's durable tiers: transfers, throughput, failures", Run: runTiers},
	{Name: "policy", Usage: "show or set a job's tier policy (JOB [POLICY])", Run: runPolicy},
	{Name: "audit", Usage: "show the coordinator's audit log: who changed what, and every refused call (--job, --who, --since)", Run: runAudit},
	{Name: "certs", Usage: "create a certificate authority and the TLS certificates of a cluster (--out DIR --nodes a,b,...)", Run: runCerts},
	{Name: "job-token", Usage: "print a job's token for its ranks (--key FILE JOB), or make a job key file (--key FILE --new)", Run: runJobToken},
	{Name: "node", Usage: "run a node of the compose cluster: the agent and the job's ranks placed on it", Run: runNode},
}

func main() { cli.Main("rewind", commands) }
