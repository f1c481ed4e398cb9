"""The shard checksum: an XXH3-64 hash tree over 1 MiB leaves.

A tensor's checksum is XXH3-64 (seed 0) of the concatenation of the
little-endian XXH3-64 hashes of its bytes cut into LEAF_SIZE pieces (the
last may be shorter; an empty tensor has no leaves, so its checksum is the
hash of the empty string). It is the Go implementation's shm.Sum
(shm/checksum.go); the leaves let a writer hash each piece right after
copying it, while it is still in cache, and on several threads.
"""

from __future__ import annotations

import struct
from typing import Iterable

import xxhash

if not hasattr(xxhash, "xxh3_64_intdigest"):
    raise ImportError("rewind needs xxhash 2.0 or later (xxh3_64_intdigest); found " + getattr(xxhash, "VERSION", "?"))

ALGO = "xxh3-64-tree-1MiB"
LEAF_SIZE = 1 << 20

leaf_hash = xxhash.xxh3_64_intdigest
"""Hash of one leaf: any object with the buffer protocol (memoryview slices
of a mapping are hashed in place, without a copy). Releases the GIL."""


def num_leaves(n: int) -> int:
    """Number of leaves of an n-byte buffer."""
    return (n + LEAF_SIZE - 1) // LEAF_SIZE


def root(leaves: Iterable[int]) -> int:
    """The checksum, given the leaf hashes in order."""
    leaves = list(leaves)
    return xxhash.xxh3_64_intdigest(struct.pack(f"<{len(leaves)}Q", *leaves))


def tree_sum(buf) -> int:
    """Checksum of a whole buffer (bytes, bytearray or memoryview)."""
    mv = memoryview(buf).cast("B")
    return root(leaf_hash(mv[i : i + LEAF_SIZE]) for i in range(0, len(mv), LEAF_SIZE))


def verify_range(buf, lo: int, hi: int, leaves: list[int], total: int, done: set[int]) -> tuple[int, str | None]:
    """Checks bytes [lo, hi) of a piece buf whose leaf hashes are leaves
    and whose checksum is total (Go's shm.VerifyRange): the leaves must
    root to total, and each leaf [lo, hi) touches that is not in done is
    hashed and compared, then added to done. Returns the bytes hashed and
    what did not match (None when all did)."""
    mv = memoryview(buf).cast("B")
    if len(leaves) != num_leaves(len(mv)):
        return 0, f"{len(leaves)} leaf hashes for {len(mv)} bytes"
    if root(leaves) != total:
        return 0, f"leaf hashes do not make the checksum {format_sum(total)}"
    hashed = 0
    for j in range(lo // LEAF_SIZE, (hi + LEAF_SIZE - 1) // LEAF_SIZE):
        if j in done:
            continue
        leaf = mv[j * LEAF_SIZE : (j + 1) * LEAF_SIZE]
        if leaf_hash(leaf) != leaves[j]:
            return hashed, f"leaf {j} (bytes {j * LEAF_SIZE} to {j * LEAF_SIZE + len(leaf)}) does not match its hash"
        hashed += len(leaf)
        done.add(j)
    return hashed, None


def format_sum(s: int) -> str:
    """A checksum as it appears in a shard header: 16 lowercase hex digits."""
    return f"{s:016x}"
