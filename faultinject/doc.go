// Package faultinject holds rewind's named fault points and the injectors
// that fire at them, in the spirit of etcd's gofail points and pebble's
// errorfs.
//
// A fault point is a place in the code at a durability or hand-off
// boundary (after a shard is copied but before it is committed, after a
// tier upload but before its manifest, ...). Every point is listed, with
// where it sits and what firing it shows, in one table (Points); code
// asks an *Injector at the point, and a nil *Injector never fires, so
// daemons started without --fault-injection pay one nil check.
//
// Faults are armed with a spec, one term per point:
//
//	point=term[;point=term...]
//
// where a term is, as in gofail,
//
//	[P%][N*]kind[(arg)][->term]
//
// P% fires with probability P per hit, N* fires at most N times, and a
// term chained with -> takes over once N is used up. The kinds:
//
//	off           never fires (a placeholder in a chain)
//	error(E)      the operation fails with E: EIO, ENOSPC, ECONNRESET, or any text
//	exit(C)       the process exits at once with status C (a crash at the point)
//	panic         the goroutine panics
//	sleep(D)      the operation is delayed by D (a Go duration), then goes on
//	corrupt       one byte of the data at the point is flipped
//	short         a write stops half-way and says so (file points)
//	torn          a write stops half-way and claims to be complete (file points)
//	status(N)     the object store answers HTTP status N (s3.request)
//	reset         the connection is reset (s3.request, gossip.send)
//	timeout       the request hangs until its context ends (s3.request)
//	drop          the packet or stream is lost (gossip.send)
//
// Each point accepts only the kinds that mean something there; Set names
// the point and the kind when a spec asks for another. The daemons take
// the spec from the environment variable REWIND_FAULTS when started with
// --fault-injection, and serve GET, PUT and DELETE on /debug/faults on
// their metrics address (Handler).
//
// An Injector is safe for concurrent use.
package faultinject
