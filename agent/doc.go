// Package agent is rewind's per-node daemon. It owns the node's shared-memory
// segments: it hands slots to training ranks (Prepare), records their commits
// (Commit), serves committed shards to local readers and remote peers (Open,
// Read), verifies checksums, and enforces the node's memory budget.
//
// The SDK reaches it over a Unix socket; peers and the coordinator over TCP;
// both carry the same gRPC service. On start it runs a pre-flight check of
// the shared-memory file system and re-indexes every segment it finds, so a
// restarted agent serves every checkpoint committed before it died, and never
// one whose bytes do not match their checksums.
package agent
