// Package coordinator is rewind's per-cluster brain. It turns the shards
// that ranks commit on their nodes into job-wide checkpoints: step S of a job
// is consistent once every rank has committed S. It keeps its index of jobs,
// nodes, steps and copies in pebble, answers operators (list, inspect,
// verify, restore plans, delete), and tells agents which step of each job is
// the latest consistent one so they never reuse its slots.
//
// The index is not the only truth: agents send their whole inventory when
// they register, so a coordinator started on an empty or lost store rebuilds
// it from them.
package coordinator
