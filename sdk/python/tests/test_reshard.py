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


def _global(name, dtype, shape, split, parts, seed):
    """A global tensor of shape, saved by four ranks split on dimension
    split in parts (lengths, some 0)."""
    g = torch.Generator().manual_seed(seed)
    n = int(np.prod(shape, dtype=np.int64))
    if dtype == torch.bool:
        data = torch.randint(0, 2, (n,), generator=g).bool()
    elif dtype.is_floating_point:
        data = torch.randn(n, generator=g).to(dtype)
    else:
        data = torch.randint(0 if dtype == torch.uint8 else -100, 100, (n,), generator=g).to(dtype)
    return {"name": name, "shape": shape, "split": split, "parts": parts, "data": data.reshape(shape)}


def nd_model():
    return [
        _global("attn", torch.bfloat16, (3, 70, 100), 1, [30, 0, 25, 15], 1),  # middle dim, one rank empty
        _global("conv", torch.float64, (2, 3, 5, 7), 3, [2, 2, 3, 0], 2),  # 4-D, last dim
        _global("q", torch.int8, (5, 121, 77), 2, [10, 33, 1, 33], 3),
        _global("mask", torch.bool, (9, 4, 3), 0, [1, 5, 0, 3], 4),
        _global("rows", torch.int16, (260, 103), 0, [110, 80, 0, 70], 5),
        _global("empty", torch.float32, (4, 0, 3), 0, [1, 1, 1, 1], 6),  # a zero-sized dimension
        _global("u8", torch.uint8, (7, 9), 1, [2, 3, 4, 0], 7),
    ]


SCALAR = torch.tensor(3.25, dtype=torch.float64)  # 0-d, saved whole by ranks 1 and 3


def save_nd(agent, job, gs, step=2):
    for r in range(4):
        ts, chunks = {}, {}
        for g in gs:
            offs = [0] * len(g["shape"])
            offs[g["split"]] = sum(g["parts"][:r])
            ts[g["name"]] = g["data"].narrow(g["split"], offs[g["split"]], g["parts"][r]).contiguous()
            chunks[g["name"]] = {"global_shape": list(g["shape"]), "offsets": offs}
        if r in (1, 3):
            ts["scalar"] = SCALAR.clone()
        with rewind.Client(socket=agent.socket, job=job, rank=r, world_size=4) as c:
            c.save_tensors(step, ts, chunks=chunks)


def nd_boxes(shape):
    """Boxes a new rank may ask for: whole, straddling pieces, thin, single elements."""
    out = [((0,) * len(shape), tuple(shape))]
    for k in range(6):
        o, ln = [0] * len(shape), list(shape)
        for d, n in enumerate(shape):
            if n:
                o[d] = (k * 7 + d * 13) % n
                ln[d] = 1 if k == 5 else max(1, (n - o[d]) // (k + 1))
        out.append((tuple(o), tuple(ln)))
    return out


@pytest.mark.parametrize("kind", ["torch", "numpy"])
def test_nd_boxes_of_every_dtype(agent, job, kind):
    """3-D and 4-D boxes of tensors sharded on inner dimensions, unevenly
    with empty pieces, of 1-, 2- and 8-byte types, a 0-d tensor and one
    with a zero-sized dimension restore bit-exact (Go's TestReshardNDBoxes)."""
    gs = nd_model()
    save_nd(agent, job, gs)
    sl, want = [], []
    for g in gs:
        if kind == "numpy" and g["data"].dtype == torch.bfloat16:
            continue  # numpy has none
        for o, ln in nd_boxes(g["shape"]):
            out = torch.zeros(ln, dtype=g["data"].dtype)
            sl.append(Slice(g["name"], o, out.numpy() if kind == "numpy" else out))
            want.append(g["data"][tuple(slice(a, a + n) for a, n in zip(o, ln))])
    sl.append(Slice("scalar", (), torch.zeros((), dtype=torch.float64)))
    want.append(SCALAR)
    with rewind.Client(socket=agent.socket, job=job, rank=0, world_size=3) as c:
        c.restore(layout=Layout(sl))
    for s, w in zip(sl, want):
        got = torch.from_numpy(s.out) if isinstance(s.out, np.ndarray) else s.out
        assert torch.equal(got, w), (s.name, s.offsets, tuple(w.shape))


@pytest.mark.parametrize("dt", [np.uint16, np.uint32, np.uint64])
def test_numpy_out_of_a_type_torch_lacks(agent, job, dt):
    """A numpy array of an unsigned type torch 1.13 has no tensor of (a
    shard holds U16, U32, U64) is restored into, not refused with
    numpy's TypeError."""
    a = (np.arange(24, dtype=np.uint64) * 0x0101010101010101).astype(dt).reshape(2, 3, 4)
    for r in range(2):
        with rewind.Client(socket=agent.socket, job=job, rank=r, world_size=2) as c:
            c.save_tensors(1, {"a": a[:, :, r * 2:r * 2 + 2].copy()},
                           chunks={"a": {"global_shape": [2, 3, 4], "offsets": [0, 0, r * 2]}})
    out = np.zeros((2, 2, 3), dtype=dt)
    with rewind.Client(socket=agent.socket, job=job, rank=0, world_size=1) as c:
        c.restore(layout=Layout([Slice("a", (0, 1, 1), out)]))
    assert np.array_equal(out, a[:, 1:, 1:])


def test_restore_into_a_parameter(agent, job):
    """A slice's out may be a model's parameter (it requires grad)."""
    save_world_4(agent, job)
    p = torch.nn.Parameter(torch.zeros(4, 3))
    with rewind.Client(socket=agent.socket, job=job, rank=1, world_size=2) as c:
        c.restore(layout=Layout([Slice("w", (4, 0), p)]))
    assert torch.equal(p.detach(), W[4:8]) and p.requires_grad


def save_rows(agent, job, boxes):
    a = torch.arange(40.0).reshape(10, 4)
    for r, (lo, hi) in enumerate(boxes):
        with rewind.Client(socket=agent.socket, job=job, rank=r, world_size=len(boxes)) as c:
            c.save_tensors(1, {"a": a[lo:hi].clone()}, chunks={"a": {"global_shape": [10, 4], "offsets": [lo, 0]}})


def test_a_box_no_piece_covers_is_not_not_found(agent, job):
    """Rows 8 and 9 saved by no rank: the restore fails naming the tensor,
    and not with NotFoundError, which a caller takes for "no checkpoint:
    start afresh" (as Go's TestReshardBadLayoutKinds)."""
    save_rows(agent, job, [(0, 4), (4, 8)])
    with rewind.Client(socket=agent.socket, job=job, rank=0, world_size=1) as c:
        with pytest.raises(rewind.RewindError, match="'a'.*cover 32 of its 40") as e:
            c.restore(layout=Layout([Slice("a", (0, 0), torch.zeros(10, 4))]))
    assert not isinstance(e.value, rewind.NotFoundError)


def test_overlapping_pieces_are_refused(agent, job):
    """Pieces that overlap without being copies (rows 0-6 and 4-8) are
    refused: counted twice, they made rows 8 and 9, which no rank saved,
    pass for covered, and the restore returned what out held there."""
    save_rows(agent, job, [(0, 6), (4, 8)])
    out = torch.full((10, 4), -1.0)
    with rewind.Client(socket=agent.socket, job=job, rank=0, world_size=1) as c:
        with pytest.raises(rewind.CorruptError, match="'a'.*overlap"):
            c.restore(layout=Layout([Slice("a", (0, 0), out)]))


def test_numpy_int_offsets_past_the_end_are_invalid(agent, job):
    """Offsets as numpy int64 whose end wraps past 2**63 are outside the
    global shape (InvalidError), not a box that no piece covers."""
    save_world_4(agent, job)
    with rewind.Client(socket=agent.socket, job=job, rank=0, world_size=1) as c:
        with pytest.raises(rewind.InvalidError, match="'w'.*outside"):
            c.restore(layout=Layout([Slice("w", np.array([np.iinfo(np.int64).max - 1, 0]), torch.zeros(2, 3))]))
        with pytest.raises(rewind.InvalidError, match="'w'.*offsets"):
            c.restore(layout=Layout([Slice("w", (0.5, 0), torch.zeros(2, 3))]))


def test_failed_restores_release_their_leases(agent, job):
    """Restores that fail (a tensor nobody saved, a dtype mismatch, a
    corrupt piece with no other copy, a bad out) release every lease:
    the step can then be deleted on every rank."""
    save_nd(agent, job, nd_model(), step=8)
    flip(agent, job, 3, 8, "q", 10)
    ok = Slice("conv", (0, 0, 0, 0), torch.zeros(1, 1, 1, 1, dtype=torch.float64))
    for sl, err in [(Slice("nope", (0,), torch.zeros(1)), rewind.NotFoundError),
                    (Slice("conv", (0, 0, 0, 0), torch.zeros(1, 1, 1, 1)), rewind.InvalidError),
                    (Slice("q", (0, 0, 0), torch.zeros(5, 121, 77, dtype=torch.int8)), rewind.CorruptError),
                    (Slice("u8", (0, 0), np.zeros((2, 2), dtype=np.uint8)[:, :1]), rewind.InvalidError)]:
        with rewind.Client(socket=agent.socket, job=job, rank=0, world_size=2) as c:
            with pytest.raises(err):
                c.restore(step=8, layout=Layout([ok, sl]))
    with rewind.Client(socket=agent.socket, job=job, rank=0, world_size=2) as c:
        assert c.delete(8, all_ranks=True) == 4


def test_many_tensors_with_long_names(agent, job):
    """A shard of 20,000 tensors with 450-byte names: once the agent has
    verified it, its answer to an open carries every name and leaf hash
    (9 MiB), more than the 8 MiB the SDK received before; a restore,
    whole or in slices, must still read it."""
    names = [f"optimizer.state.{i:06d}." + "model.decoder.layers.block_sparse_moe.experts.w1.exp_avg_sq." * 7
             for i in range(20_000)]
    tensors = {n: torch.tensor([i, -i], dtype=torch.float32) for i, n in enumerate(names)}
    with rewind.Client(socket=agent.socket, job=job, rank=0, world_size=1, timeout=60) as c:
        c.save_tensors(1, tensors)
    wait_verified(agent, job)
    with rewind.Client(socket=agent.socket, job=job, rank=0, world_size=1, timeout=60) as c:
        _, got = c.restore()
        assert len(got) == len(tensors)
        assert all(torch.equal(got[n], t) for n, t in tensors.items())
    outs = {n: torch.empty(1, dtype=torch.float32) for n in names}
    with rewind.Client(socket=agent.socket, job=job, rank=1, world_size=2, timeout=60) as c:
        c.restore(layout=Layout([Slice(n, (1,), out) for n, out in outs.items()]))
    assert all(outs[n].item() == -i for i, n in enumerate(names))


def test_a_step_saved_at_two_world_sizes(agent, job):
    """An agent alone (no coordinator to fence the old gang) holds step 6
    of two gangs, neither whole: ranks 1 to 3 of the old one at world
    size 4 (its rank 0 died in that save) and rank 0 of a new one at
    world size 2 (its rank 1 died in that save). Step 6 is whole at no
    world size, though every rank of 0 to 3 has a shard of it: the
    restore picks step 5, whole at world size 4."""
    save_world_4(agent, job)
    for r, (lo, hi) in enumerate(SAVED_ROWS):
        if r > 0:
            with rewind.Client(socket=agent.socket, job=job, rank=r, world_size=4) as c:
                c.save_tensors(6, {"w": W[lo:hi] + 100, "b": B.clone()},
                               chunks={"w": {"global_shape": [10, 3], "offsets": [lo, 0]}})
    with rewind.Client(socket=agent.socket, job=job, rank=0, world_size=2) as c:
        c.save_tensors(6, {"w": W[:5] + 1, "b": B.clone()}, chunks={"w": {"global_shape": [10, 3], "offsets": [0, 0]}})
    for r, (lo, hi) in enumerate(rows(2)):
        w, b = torch.empty(hi - lo, 3), torch.empty(5, dtype=torch.float64)
        with rewind.Client(socket=agent.socket, job=job, rank=r, world_size=2) as c:
            res = c.restore(layout=Layout([Slice("w", (lo, 0), w), Slice("b", (0,), b)]))
        assert (res.step, res.saved_world_size) == (5, 4)
        assert torch.equal(w, W[lo:hi]) and torch.equal(b, B)
