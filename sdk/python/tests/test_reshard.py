"""Client.restore(layout=...): a checkpoint saved at one world size restored
at another, each new rank reading exactly the boxes of the global tensors
it now holds, every piece it reads verified."""

import json

import numpy as np
import pytest
import torch

import rewind
from rewind import Layout, Slice

W = torch.arange(30, dtype=torch.float32).reshape(10, 3)  # sharded by rows
B = torch.tensor([1.5, -2.0, 3.25, 0.0, 7.0], dtype=torch.float64)  # replicated on every rank
SAVED_ROWS = [(0, 3), (3, 6), (6, 8), (8, 10)]  # uneven, as FSDP pads none


def save_world_4(agent, job, step=5):
    for r, (lo, hi) in enumerate(SAVED_ROWS):
        with rewind.Client(socket=agent.socket, job=job, rank=r, world_size=4) as c:
            c.save_tensors(step, {"w": W[lo:hi].clone(), "b": B.clone()}, objects=json.dumps({"rank": r}).encode(),
                           chunks={"w": {"global_shape": [10, 3], "offsets": [lo, 0]}})


def rows(n):
    """Row boxes of W for a world of n ranks, as torch.chunk splits."""
    out, lo = [], 0
    for part in torch.chunk(torch.arange(10), n):
        out.append((lo, lo + len(part)))
        lo += len(part)
    return out


@pytest.mark.parametrize("world", [3, 6, 1])
def test_restore_at_another_world_size(agent, job, world):
    save_world_4(agent, job)
    for r, (lo, hi) in enumerate(rows(world)):
        w, b = torch.empty(hi - lo, 3), torch.empty(5, dtype=torch.float64)
        with rewind.Client(socket=agent.socket, job=job, rank=r, world_size=world) as c:
            res = c.restore(layout=Layout([Slice("w", (lo, 0), w), Slice("b", (0,), b)]))
        assert (res.step, res.saved_world_size) == (5, 4)
        assert torch.equal(w, W[lo:hi]) and torch.equal(b, B)
        assert json.loads(res.objects) == {"rank": 0}
        assert res.bytes == w.numel() * 4 + b.numel() * 8
        # Every piece read is hashed whole: at least the bytes copied.
        assert res.verified >= res.bytes


def test_a_box_across_pieces_into_numpy(agent, job):
    save_world_4(agent, job)
    out = np.zeros((6, 2), dtype=np.float32)  # rows 2..8 (four saved pieces), columns 1..3
    with rewind.Client(socket=agent.socket, job=job, rank=0, world_size=2) as c:
        res = c.restore(layout=Layout([Slice("w", (2, 1), out)], objects_rank=2))
    assert np.array_equal(out, W[2:8, 1:3].numpy())
    assert json.loads(res.objects) == {"rank": 2}


def flip(agent, job, rank, step, name, at=0):
    """Flips byte at of rank's piece name in its shard file."""
    with rewind.Client(socket=agent.socket, job=job, rank=rank, world_size=rank + 1) as c:
        with c.open_shard(rank, step) as sh:
            off = sh.header.data_start + sh.header.tensor(name).begin + at
        path = next(s.path for s in c.list() if s.rank == rank and s.step == step)
    with open(path, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0xFF]))


def test_corrupt_replica_read_from_another_rank(agent, job):
    save_world_4(agent, job)
    flip(agent, job, 0, 5, "b")  # rank 0's copy of the replicated bias
    b = torch.empty(5, dtype=torch.float64)
    with rewind.Client(socket=agent.socket, job=job, rank=0, world_size=1) as c:
        c.restore(layout=Layout([Slice("b", (0,), b)]))
    assert torch.equal(b, B)


def test_corrupt_piece_with_no_other_copy(agent, job):
    save_world_4(agent, job)
    flip(agent, job, 2, 5, "w")
    w = torch.empty(10, 3)
    with rewind.Client(socket=agent.socket, job=job, rank=0, world_size=1) as c:
        with pytest.raises(rewind.CorruptError, match="rank 2.*(checksum|does not match)"):
            c.restore(step=5, layout=Layout([Slice("w", (0, 0), w)]))


@pytest.mark.parametrize("sl, objects_rank, err, says", [
    (Slice("nope", (0,), torch.empty(2)), 0, rewind.NotFoundError, "no rank saved tensor 'nope'"),
    (Slice("w", (0, 0), torch.empty(2, 3, dtype=torch.float64)), 0, rewind.InvalidError, "out is F64"),
    (Slice("w", (9, 0), torch.empty(2, 3)), 0, rewind.InvalidError, "outside its global shape"),
    (Slice("w", (0,), torch.empty(2, 3)), 0, rewind.InvalidError, "offsets"),
    (Slice("w", (0, 0), torch.empty(3, 2).t()), 0, rewind.InvalidError, "contiguous"),
    (Slice("b", (0,), torch.empty(5, dtype=torch.float64)), 4, rewind.InvalidError, "objects of rank 4"),
])
def test_bad_layouts_are_refused(agent, job, sl, objects_rank, err, says):
    save_world_4(agent, job)
    with rewind.Client(socket=agent.socket, job=job, rank=0, world_size=2) as c:
        with pytest.raises(err, match=says):
            c.restore(layout=Layout([sl], objects_rank=objects_rank))


def wait_verified(agent, job):
    """Until the agent has verified every shard of job (it then gives the
    leaf hashes a restore checks its reads against)."""
    import time
    deadline = time.monotonic() + 30
    with rewind.Client(socket=agent.socket, job=job, rank=0, world_size=1) as c:
        while not all(s.verified for s in c.list()):
            assert time.monotonic() < deadline, "the agent did not verify the shards"
            time.sleep(0.05)


def test_only_the_leaves_read_are_hashed(agent, job):
    big = torch.arange(4 << 20, dtype=torch.uint8).reshape(4096, 1024)  # 4 MiB; 2 MiB, two leaves, per old rank
    for r in range(2):
        with rewind.Client(socket=agent.socket, job=job, rank=r, world_size=2) as c:
            c.save_tensors(1, {"big": big[r * 2048:(r + 1) * 2048].clone()},
                           chunks={"big": {"global_shape": [4096, 1024], "offsets": [r * 2048, 0]}})
    wait_verified(agent, job)
    out = torch.empty(1024, 1024, dtype=torch.uint8)  # rows 1024-2047: old rank 0's second leaf
    with rewind.Client(socket=agent.socket, job=job, rank=1, world_size=4) as c:
        res = c.restore(layout=Layout([Slice("big", (1024, 0), out)]))
    assert torch.equal(out, big[1024:2048])
    assert (res.bytes, res.verified) == (1 << 20, 1 << 20)
    flip(agent, job, 0, 1, "big", 10)  # a byte of old rank 0's first leaf: not read by new rank 1
    with rewind.Client(socket=agent.socket, job=job, rank=1, world_size=4) as c:
        c.restore(layout=Layout([Slice("big", (1024, 0), out)]))
    with rewind.Client(socket=agent.socket, job=job, rank=0, world_size=4) as c:
        with pytest.raises(rewind.CorruptError, match="leaf 0"):
            c.restore(layout=Layout([Slice("big", (0, 0), torch.empty(1024, 1024, dtype=torch.uint8))]))



class _Unfetchable:
    """A partially open shard whose fetch fails as an agent out of budget
    answers: the bytes were never read, so nothing says they are bad."""

    def tensor_range(self, name, lo, hi):
        return (lo, hi - lo)

    def fill(self, ranges):
        raise rewind.ResourceExhaustedError("fill job j rank 0", "memory budget exhausted")

    def verify_range(self, name, lo, hi):
        raise AssertionError("bytes never fetched were verified")


def test_a_copy_that_cannot_be_fetched_is_not_corrupt():
    """When no copy of a piece can be fetched because the agent is out of
    budget, the restore fails with that reason (ResourceExhaustedError,
    to retry or make room), naming each copy tried, not CorruptError,
    which says the checkpoint's bytes are bad."""
    from rewind.reshard import Resharded, _Piece, _verified

    copies = [_Piece(rank=r, name="w", offsets=(0,), shape=(4,), global_shape=(4,), dtype="F32") for r in (0, 1)]
    with pytest.raises(rewind.RewindError) as e:
        _verified("reshard restore", {0: _Unfetchable(), 1: _Unfetchable()}, copies, [0], [4], 4, set(),
                  Resharded(step=1, saved_world_size=2, objects=None))
    assert isinstance(e.value, rewind.ResourceExhaustedError) and not isinstance(e.value, rewind.CorruptError)
    assert "rank 0: memory budget exhausted" in str(e.value) and "rank 1:" in str(e.value)
