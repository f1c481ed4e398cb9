"""One rank of a DCP edge-case test (tests/test_dcp_cases.py starts
world-size many).

    dcp_cases_worker.py ACTION RANK WORLD PORT OUT CASE [--step N] [--id] [--keys K,...] [--async]

CASE names the state (CASES); ACTION is save or load. A save writes every
value of the state for step N (the values depend on the step) through
rewind.dcp.Writer and, on rank 0, the full values to
OUT/reference-N.pt; a load fills a template of the same structure (zeros,
defaults) through rewind.dcp.Reader (--step N, else the latest), and
compares every full value with the reference of the step it loaded.
--id passes the step as dcp's checkpoint_id (rewind://JOB/step-N, or
rewind://JOB without --step) instead of Writer(step=)/Reader(step=);
--keys loads only the keys starting with one of the given prefixes;
--async saves with dcp.async_save; --group N saves with a process
group of the first N ranks (the others do not save). A rank writes what
it saw to OUT/rank-N.json.
"""

from __future__ import annotations

import argparse
import faulthandler
import inspect
import io
import json
import os
import sys
import zlib

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import rewind.dcp  # noqa: E402
from dcp_worker import flat  # noqa: E402  (beside this file: the script's directory is on sys.path)


def value(name: str, shape, dtype, salt: int) -> torch.Tensor:
    """A seeded full tensor for name and salt; zeros for salt 0."""
    if not salt:
        return torch.zeros(shape, dtype=dtype)
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()) * 1000 + salt)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if not dtype.is_floating_point:
        return torch.randint(-1000, 1000, shape, generator=g, dtype=dtype)
    return torch.randn(shape, generator=g).to(dtype)


def meshes(world: int):
    """A 1-D mesh of every rank, and a 2-D one (2, world/2) where world is
    even and over 2 (HSDP: replicas of a sharded tensor), else the 1-D."""
    one = init_device_mesh("cpu", (world,))
    two = init_device_mesh("cpu", (2, world // 2)) if world % 2 == 0 and world > 2 else one
    return one, two


def distribute(v, mesh, place):
    """distribute_tensor of v, which every rank holds whole: where torch can
    (2.5 and later), each rank takes its piece of its own v, with no
    scatter (torch 2.14's gloo scatters no bfloat16)."""
    if "src_data_rank" in inspect.signature(distribute_tensor).parameters:
        return distribute_tensor(v, mesh, place, src_data_rank=None)
    return distribute_tensor(v, mesh, place)


def odd(world: int, salt: int, plain: bool = False) -> dict:
    """Dense tensors of every layout and dtype, DTensors sharded on either
    dimension (some ranks with empty pieces), and non-tensor state.
    plain: full tensors in place of the DTensors, and no device mesh (one
    process without torch.distributed)."""
    one, two = meshes(world) if not plain else (None, None)

    def dt(name, shape, place, dtype=torch.float32, mesh=one):
        v = value(name, shape, dtype, salt)
        return v if plain else distribute(v, mesh, place)

    return {
        "dense": {
            "transposed": value("transposed", (6, 4), torch.float32, salt).t(),
            "sliced": value("sliced", (6, 8), torch.float32, salt)[:, 1::3],
            "scalar": value("scalar", (), torch.float32, salt),
            "empty": torch.empty(0, 3),
            "bf16": value("bf16", (5, 3), torch.bfloat16, salt),
            "f16": value("f16", (7,), torch.float16, salt),
            "i64": value("i64", (4, 2), torch.int64, salt),
            "bool": value("bool", (9,), torch.bool, salt),
            "list": [value("l0", (3,), torch.float32, salt), value("l1", (2, 2), torch.float64, salt)],
        },
        "dt": {
            "shard1": dt("shard1", (6, 10), [Shard(1)]),
            "shard1_uneven": dt("shard1_uneven", (3, 5), [Shard(1)], torch.float64),
            "rows3": dt("rows3", (3, 7), [Shard(0)]),
            "one": dt("one", (1, 4), [Shard(0)]),
            "rep": dt("rep", (5, 3), [Replicate()]),
            "bf16": dt("dt_bf16", (9, 4), [Shard(0)], torch.bfloat16),
            "i64": dt("dt_i64", (10,), [Shard(0)], torch.int64),
            "hsdp": dt("hsdp", (11, 6), [Replicate(), Shard(0)] if two is not one else [Shard(0)], mesh=two),
            "2d": dt("2d", (7, 5), [Shard(0), Shard(1)] if two is not one else [Shard(1)], mesh=two),
            "2d_rows": dt("2d_rows", (7, 3), [Shard(0), Shard(0)] if two is not one else [Shard(0)], mesh=two),
            # Saved as a plain tensor (every rank's the same), loaded into a DTensor.
            "from_plain": value("from_plain", (5, 6), torch.float32, salt) if salt or plain else
            dt("from_plain", (5, 6), [Shard(1)]),
        },
        "objs": {
            "step": 17 * salt,
            "sched": {"last_epoch": 5 * salt, "base_lrs": [0.1 * salt, 0.2], "verbose": bool(salt)},
            "buf": io.BytesIO(b"saved %d" % salt if salt else b""),
            "mixed": [value("m0", (2,), torch.float32, salt), 3 * salt, "x" * salt],
            "nested": {"a": {"b": [1 * salt, {"c": 2 * salt}]}},
            "tuple": (salt, "t"),
            "none": None if salt else 0,
        },
    }


def tiny(world: int, salt: int) -> dict:
    """One replicated tensor: DCP gives it to one rank, the others write nothing."""
    return {"w": value("w", (3,), torch.float32, salt)}


def at_sign(world: int, salt: int) -> dict:
    """A key that reads like a piece's shard tensor name (FQN@offsets):
    DCP gives the replicated "w@2" to the rank that holds w's piece at 2."""
    mesh = init_device_mesh("cpu", (world,))
    return {"w": distribute_tensor(value("w", (4,), torch.float32, salt), mesh, [Shard(0)]),
            "w@2": value("w@2", (3,), torch.float32, salt)}


CASES = {"odd": odd, "tiny": tiny, "at_sign": at_sign}


def whole(v):
    """A comparable full value (DTensor.full_tensor is a collective: every
    rank calls it in the same order)."""
    if isinstance(v, DTensor) and v.dtype in (torch.bfloat16, torch.float16):  # gathered as float32, losslessly:
        return v.to(torch.float32).full_tensor().to(v.dtype)  # torch 2.14's gloo moves no bfloat16
    if isinstance(v, DTensor):
        return v.full_tensor()
    if isinstance(v, torch.Tensor):
        return v.contiguous()
    if isinstance(v, io.BytesIO):
        return ("BytesIO", v.getvalue())
    return v


def equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    return type(a) is type(b) and a == b


def keep(d: dict, prefixes: list[str], prefix: str = "") -> dict:
    """d with only the leaves whose flat key starts with one of prefixes."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            sub = keep(v, prefixes, key + "/")
            if sub:
                out[k] = sub
        elif any(key.startswith(p) for p in prefixes):
            out[k] = v
    return out


def main() -> None:
    faulthandler.dump_traceback_later(240, exit=True)  # a hung rank prints where, and ends
    p = argparse.ArgumentParser()
    for a in ("action", "rank", "world", "port", "out", "case"):
        p.add_argument(a)
    p.add_argument("--step", type=int)
    p.add_argument("--id", action="store_true")
    p.add_argument("--keys")
    p.add_argument("--async", dest="async_", action="store_true")
    p.add_argument("--group", type=int, help="save with a process group of the first N ranks; the rest do not save")
    p.add_argument("--fail-rank", type=int, help="save-fails: the rank whose writer has no agent")
    p.add_argument("--rank-steps", help="load-mixed: the step each rank names, comma-separated")
    args = p.parse_args()
    rank, world, out = int(args.rank), int(args.world), args.out
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=world)
    job = os.environ["REWIND_JOB"]
    res: dict = {"rank": rank}
    build = CASES[args.case]
    cid = f"{rewind.dcp.SCHEME}{job}" + (f"/step-{args.step}" if args.step is not None else "")
    group = dist.new_group(list(range(args.group))) if args.group else None
    if args.action == "save" and group is not None and rank >= args.group:
        pass
    elif args.action == "save":
        sd = build(world, args.step)
        if args.id:
            kw = {"checkpoint_id": cid, "storage_writer": rewind.dcp.Writer()}
        else:
            kw = {"storage_writer": rewind.dcp.Writer(step=args.step)}
        if group is not None:
            kw["process_group"] = group
        if args.async_:
            dcp.async_save(sd, **kw).result()
        else:
            dcp.save(sd, **kw)
        ref = {k: whole(v) for k, v in flat(build(world, args.step))}
        if rank == 0:
            torch.save(ref, os.path.join(out, f"reference-{args.step}.pt"))
    elif args.action == "save-fails":
        # Rank --fail-rank's writer names a socket no agent listens on: every
        # rank must raise DCP's CheckpointException naming that failure.
        sock = os.path.join(out, "no-agent.sock") if rank == args.fail_rank else None
        try:
            dcp.save(build(world, args.step), storage_writer=rewind.dcp.Writer(step=args.step, socket=sock, timeout=5))
            res["error"] = None
        except BaseException as e:  # CheckpointException is a BaseException
            res["error"] = f"{type(e).__name__}: {e}"
    elif args.action == "load-mixed":
        # Each rank names its own step: the load must fail on every rank
        # rather than mix steps.
        step = int(args.rank_steps.split(",")[rank])
        try:
            dcp.load(build(world, 0), storage_reader=rewind.dcp.Reader(step=step))
            res["error"] = None
        except BaseException as e:  # CheckpointException is a BaseException
            res["error"] = f"{type(e).__name__}: {e}"
    elif args.action == "load":
        sd = build(world, 0)
        if args.keys:
            sd = keep(sd, args.keys.split(","))
        if args.id:
            reader = rewind.dcp.Reader()
            dcp.load(sd, checkpoint_id=cid, storage_reader=reader)
        else:
            reader = rewind.dcp.Reader(step=args.step)
            dcp.load(sd, storage_reader=reader)
        got = {k: whole(v) for k, v in flat(sd)}
        ref = torch.load(os.path.join(out, f"reference-{reader.loaded_step}.pt"), weights_only=False)
        res["keys"] = sorted(got)
        res["mismatch"] = sorted(f"{k}: got {got[k]!r}, saved {ref.get(k, '(none)')!r}"
                                 for k in got if k not in ref or not equal(ref[k], got[k]))
        res["loaded_step"] = reader.loaded_step
        res["saved_world_size"] = reader.saved_world_size
    else:
        raise SystemExit(f"unknown action {args.action}")
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
        json.dump(res, f)
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # not destroy_process_group: with gloo it sometimes never returns


if __name__ == "__main__":
    main()
