"""rewind.dcp_stage: the snapshot dcp.async_save writes from, without a
process group (test_dcp.py's async test runs it under DCP)."""

from __future__ import annotations

import collections
import dataclasses
import importlib

import pytest

pytest.importorskip("torch.distributed.checkpoint.metadata", reason="needs torch 2.x")
try:
    importlib.import_module("rewind.dcp")  # its torch 2.x check first
    from rewind.dcp_stage import Snapshot
except ImportError as e:
    pytest.skip(f"rewind.dcp: {e}", allow_module_level=True)

import numpy as np
import torch

import rewind


def state():
    big = torch.arange(4096, dtype=torch.float32)
    return {
        "w": torch.randn(64, 48),
        "wt": None,  # the transposed view of w, below
        "slice": big[100:300],  # a view of part of a storage
        "bytes_of_big": big[1000:1004].view(torch.uint8),  # another dtype's view of the same storage
        "scalar": torch.tensor(7, dtype=torch.int64),
        "empty": torch.empty(0, 3),
        "nested": {"list": [torch.ones(5), 3, "note"], "betas": (0.9, 0.99)},
    }


def test_staged_pieces_keep_the_values_at_stage_time():
    sd = state()
    sd["wt"] = sd["w"].t()
    before = {k: v.clone() for k, v in sd.items() if isinstance(v, torch.Tensor)}
    before["list0"] = sd["nested"]["list"][0].clone()
    snap = Snapshot(sd)
    staged = snap.state_dict
    with torch.no_grad():  # the loop's next step, in place
        for v in (sd["w"], sd["slice"], sd["scalar"], sd["nested"]["list"][0]):
            v.add_(1)
        sd["bytes_of_big"].fill_(0)
    for k in ("w", "wt", "slice", "bytes_of_big", "scalar", "empty"):
        got = snap.staged(staged[k])
        assert got.dtype == before[k].dtype and got.shape == before[k].shape and torch.equal(got, before[k]), k
        assert got.stride() == before[k].stride(), k  # the same view: a transposed view stays transposed
    assert torch.equal(snap.staged(staged["nested"]["list"][0]), before["list0"])
    assert not torch.equal(sd["w"], before["w"])  # the live tensors did change


def test_containers_and_values_are_the_snapshots_own():
    sd = state()
    snap = Snapshot(sd)
    sd["nested"]["list"][1] = 4
    sd["nested"]["extra"] = 1
    sd["new"] = torch.zeros(1)
    assert snap.state_dict["nested"]["list"][1] == 3 and "extra" not in snap.state_dict["nested"]
    assert "new" not in snap.state_dict
    assert snap.state_dict["nested"]["betas"] == (0.9, 0.99)
    w = snap.state_dict["w"]  # a copy, in the same view: DCP plans with its metadata and writes it
    assert w is not sd["w"] and torch.equal(w, sd["w"]) and w.stride() == sd["w"].stride()


def test_a_tensor_the_snapshot_does_not_hold_is_returned_as_it_is():
    snap = Snapshot({"w": torch.ones(3)})
    other = torch.zeros(3)
    assert snap.staged(other) is other


def test_buffers_are_reused_once_the_save_is_done():
    sd = {"w": torch.randn(1 << 16), "b": torch.randn(10)}
    first = Snapshot(sd)
    bufs = {sp.buf.data_ptr() for sp in first.spans.values()}
    during = Snapshot(sd)  # a second save before the first is done: buffers of its own
    assert bufs.isdisjoint(sp.buf.data_ptr() for sp in during.spans.values())
    first.release()
    before = sd["w"].clone()
    after = Snapshot(sd)
    assert {sp.buf.data_ptr() for sp in after.spans.values()} == bufs
    with torch.no_grad():
        sd["w"].add_(1)
    assert torch.equal(after.staged(sd["w"]), before)


def test_lazy_conjugate_and_negative_views_keep_their_bits():
    """A lazy conjugate (and the negative view its .imag is) reads its
    storage through a bit: the staged view carries the bit too, or the
    save writes the unconjugated values that dcp.save does not."""
    c = torch.randn(4, 3, dtype=torch.complex64)
    sd = {"conj": c.conj(), "neg": c.conj().imag, "plain": c}
    want = {k: v.resolve_conj().resolve_neg().clone() for k, v in sd.items()}
    snap = Snapshot(sd)
    with torch.no_grad():
        c.add_(1)
    for k, v in sd.items():
        got = snap.staged(v.detach())
        assert torch.equal(got.resolve_conj().resolve_neg(), want[k]), k


def test_tensors_in_a_tuple_keep_the_values_at_stage_time():
    """DCP pickles a tuple whole (its tensors too) while it writes: the
    snapshot holds a copy of it, of its own type (torch.Size stays one)."""
    t = torch.zeros(3)
    shape = torch.Size([2, 3])
    Pair = collections.namedtuple("Pair", "a b")
    sd = {"tup": (t, 1), "pair": Pair(t, [t]), "shape": shape, "nested": [(t,)]}
    snap = Snapshot(sd)
    with torch.no_grad():
        t.add_(1)
    st = snap.state_dict
    assert torch.equal(st["tup"][0], torch.zeros(3)) and st["tup"][1] == 1
    assert type(st["pair"]) is Pair and torch.equal(st["pair"].a, torch.zeros(3))
    assert torch.equal(st["pair"].b[0], torch.zeros(3)) and torch.equal(st["nested"][0][0], torch.zeros(3))
    assert type(st["shape"]) is torch.Size and st["shape"] == shape


@dataclasses.dataclass
class Stats:
    """A user's object holding a tensor that is not a graph leaf."""

    loss: torch.Tensor
    n: int


def test_a_value_dcp_pickles_but_deepcopy_refuses_is_staged():
    """deepcopy refuses tensors with a grad_fn, torch.save (what DCP
    writes such a value with) does not: staging copies the value anyway."""
    w = torch.ones(3, requires_grad=True)
    sd = {"stats": Stats(w * 2, 5), "pair": (w * 3, 1)}
    snap = Snapshot(sd)
    assert isinstance(snap.state_dict["stats"], Stats) and snap.state_dict["stats"].n == 5
    assert torch.equal(snap.state_dict["stats"].loss, torch.full((3,), 2.0))
    assert torch.equal(snap.state_dict["pair"][0], torch.full((3,), 3.0))


def test_two_storages_at_one_address_are_staged_apart():
    """Two storages may start at one address (torch.from_numpy of an array
    and of a slice of it): each is copied within its own bytes."""
    arr = np.arange(100, dtype=np.float32)
    sd = {"head": torch.from_numpy(arr[:10]), "all": torch.from_numpy(arr)}
    snap = Snapshot(sd)
    want = {k: v.clone() for k, v in sd.items()}
    arr += 1
    for k, v in sd.items():
        assert torch.equal(snap.staged(v), want[k]), k


def saves_its_own_values(w, sd, agent, job) -> bool:
    """Whether a dcp.save through w, after sd's x changed, writes x's new
    values (those a load of the step gets)."""
    import torch.distributed.checkpoint as dcp

    with torch.no_grad():
        sd["x"].fill_(2)
    dcp.save(sd, checkpoint_id=f"rewind://{job}/step-1", storage_writer=w)
    got = {"x": torch.zeros(4)}
    dcp.load(got, checkpoint_id=f"rewind://{job}/step-1", storage_reader=rewind.dcp.Reader(socket=agent.socket))
    return got["x"].tolist() == [2.0] * 4


def test_a_save_after_a_failed_async_save_writes_its_own_values(agent, job):
    """An async_save that fails before it writes (a checkpoint_id without
    a step) leaves nothing staged behind: a dcp.save through the same
    Writer (a retry) writes the values at its own call."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

    w = rewind.dcp.Writer(socket=agent.socket)
    sd = {"x": torch.ones(4)}
    fut = dcp.async_save(sd, checkpoint_id=f"rewind://{job}", storage_writer=w)
    with pytest.raises(CheckpointException, match="no step"):
        fut.result()
    assert saves_its_own_values(w, sd, agent, job)


def test_a_save_after_the_writer_went_to_dcps_checkpoint_process(agent, job):
    """The process executor sends the writer, pickled, to DCP's checkpoint
    process once its stage ran; the snapshot goes with the state dict. A
    dcp.save through the same Writer afterwards writes the values at its
    own call, not the snapshot's."""
    import pickle

    w = rewind.dcp.Writer(socket=agent.socket)
    sd = {"x": torch.ones(4)}
    w.stage(sd)
    pickle.dumps(w)  # what the executor sends
    assert saves_its_own_values(w, sd, agent, job)


def test_a_local_shards_wrapper_is_staged_shard_by_shard():
    """torch's LocalShardsWrapper (torchrec's local piece of a DTensor, and
    a value dcp.save writes by itself) lists plain tensors as its
    local_shards, not ShardedTensor's Shards: each is staged."""
    try:
        from torch.distributed.tensor._shards_wrapper import LocalShardsWrapper
    except ImportError:
        pytest.skip("this torch has no LocalShardsWrapper")
    a, b = torch.ones(2, 3), torch.zeros(2, 3)
    snap = Snapshot({"w": LocalShardsWrapper([a, b], [torch.Size([0, 0]), torch.Size([0, 3])])})
    with torch.no_grad():
        a.add_(1)
        b.add_(1)
    assert torch.equal(snap.staged(a), torch.ones(2, 3)) and torch.equal(snap.staged(b), torch.zeros(2, 3))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_gpu_tensors_staged_into_page_locked_buffers():
    """GPU tensors are copied (after the work queued on them) into host
    buffers page-locked by registration, exactly their size; the staged
    views keep the values when the tensors change on the GPU."""
    w = torch.zeros(3 << 20, device="cuda")  # 12 MiB: registered
    b = torch.arange(10.0, device="cuda")  # small: pageable
    for _ in range(10):
        w.add_(1)  # queued, likely still running
    snap = Snapshot({"w": w, "b": b})
    w.add_(1)
    b.mul_(2)
    got = snap.staged(w)
    assert got.device.type == "cpu" and torch.equal(got, torch.full((3 << 20,), 10.0))
    assert torch.equal(snap.staged(b), torch.arange(10.0))
    big = next(sp.buf for sp in snap.spans.values() if sp.buf.numel() >= 12 << 20)
    assert big.is_pinned() and big.numel() == 12 << 20
    snap.release()


def _mapped(address: int) -> bool:
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= address < hi:
                return True
    return False


@pytest.mark.parametrize("registered", [True, False])
def test_page_locked_buffers_are_unregistered_once_while_mapped(monkeypatch, registered):
    """Without a GPU, rewind.cuda's pin and unpin recorded: a GPU span's
    buffer registers exactly its own pages (page-aligned, its size, not a
    power of two), and when the buffer goes it is unregistered once, while
    its pages are still mapped (unregistering after munmap leaves them
    locked, and could unregister another mapping made at the same
    address); a view that outlives it still reads its bytes. A failed
    registration is never undone; a small buffer is never registered."""
    import gc
    import mmap

    import rewind.dcp_stage as stage

    calls: list = []
    monkeypatch.setattr(stage.cuda, "pin", lambda addr, n, what, stacklevel=2: calls.append(("pin", addr, n)) or registered)
    monkeypatch.setattr(stage.cuda, "unpin", lambda addr: calls.append(("unpin", addr, _mapped(addr))))
    n = (3 << 20) + 4096
    buf = stage._host_buffer(n, pinned=True)
    addr = buf.data_ptr()
    assert calls == [("pin", addr, n)] and addr % mmap.PAGESIZE == 0 and buf.numel() == n
    view = buf[4096:8192].view(torch.float32)  # what a staged tensor holds
    view.fill_(1.5)
    del buf  # the snapshot's reference: a view outliving it keeps the pages, unlocked
    gc.collect()
    assert calls[1:] == ([("unpin", addr, True)] if registered else [])
    assert float(view[0]) == 1.5 and _mapped(addr)
    del view
    gc.collect()
    assert len(calls) == (2 if registered else 1)
    stage._host_buffer(stage._PIN_MIN - 1, pinned=True)
    assert len(calls) == (2 if registered else 1)


def test_the_staged_state_pickles_as_dcps_process_executor_sends_it(tmp_path):
    """DCP's process executor pickles the staged state into its checkpoint
    process (torch's ForkingPickler: each storage moves into shared memory
    as it is sent). Rebuilt, it holds the values at stage time, the loop
    having changed every tensor since: two DTensor pieces of one storage
    (the second starting past its first byte, which torch 2.14 crashed
    pickling, and whose bytes the move of the first must not free), plain
    views of it, a lazy conjugate (pickling drops the bit), an empty
    piece."""
    import io
    import pickle
    from multiprocessing.reduction import ForkingPickler

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from rewind.dcp_stage import DTensor
    try:
        from torch.distributed.tensor import Shard
    except ImportError:  # torch 2.0-2.3
        from torch.distributed._tensor import Shard

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        flat = torch.arange(40.0)
        c = torch.randn(3, dtype=torch.complex64)
        sd = {"d0": DTensor.from_local(flat[:8], mesh, [Shard(0)], run_check=False),
              "d1": DTensor.from_local(flat[8:20].view(3, 4), mesh, [Shard(0)], run_check=False),
              "v": flat.view(4, 10)[:, 5:], "c": c.conj(), "n": torch._neg_view(c[:2]),
              "e": DTensor.from_local(flat[40:], mesh, [Shard(0)], run_check=False)}
        want = {k: (v.to_local() if isinstance(v, DTensor) else v).resolve_conj().resolve_neg().clone()
                for k, v in sd.items()}
        staged = Snapshot(sd).state_dict
        with torch.no_grad():
            flat.add_(100)
            c.mul_(2)
        buf = io.BytesIO()
        ForkingPickler(buf).dump(staged)
        got = pickle.loads(buf.getvalue())
        for k, w in want.items():
            g = got[k].to_local() if isinstance(got[k], DTensor) else got[k]
            assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w), k
    finally:
        dist.destroy_process_group()
