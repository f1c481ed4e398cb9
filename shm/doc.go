// Package shm owns rewind's shared-memory segments and the shard file format.
//
// A segment is one file under a root directory on tmpfs (default
// /dev/shm/rewind), one per (job, rank, slot). Its space is reserved with
// fallocate when it is created or resized, so a shortage of shared memory is
// an error at allocation time and never a SIGBUS while a rank writes into it.
// Segments are reused across steps: a writer maps a slot once and keeps the
// mapping, so a warm save pays no page faults.
//
// The bytes of a segment are a shard: a safetensors file (8-byte
// little-endian header length, JSON header, data) whose header is padded with
// spaces so the data starts 4 KiB-aligned, and whose __metadata__ carries the
// job, rank, world size, step, a checksum per tensor and the non-tensor state
// as JSON. The same bytes are what every tier stores.
//
// Checksums are XXH3-64 hash trees over 1 MiB leaves (see Sum), computed in
// the same pass as the copy by CopyAndSum, which spreads the work over
// several goroutines.
//
// The package does no networking.
package shm
