// Package tiers makes checkpoints durable beyond a node's memory: one Store
// interface with a local directory implementation (NVMe, or a shared /
// parallel filesystem mounted on every node) and an S3-compatible object
// store. Shards are stored as they lie in shared memory (the same
// safetensors bytes); a step's copy on a tier exists only once its manifest
// is written, after every shard.
package tiers
