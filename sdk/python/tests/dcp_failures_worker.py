"""One rank of a DCP failure test (tests/test_dcp_failures.py starts
world-size many).

    dcp_failures_worker.py ACTION RANK WORLD PORT OUT --salt S [--step N] [--fail-rank R]

save: dcp.save of the state for salt S (every value depends on it) as
step N through rewind.dcp.Writer; with --fail-rank R, rank R's writer
raises in write_data, after the other ranks' shards may be committed.
load: dcp.load through rewind.dcp.Reader (step N, else the latest) into a
zero state, and, for every key, the salt of which the loaded value is
(0: none of 1-9). A rank writes what it saw to OUT/rank-N.json.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import rewind.dcp  # noqa: E402

SALTS = range(1, 10)


def state(world: int, salt: int) -> dict:
    """A DTensor sharded unevenly (7 rows), a replicated one, a plain
    tensor and a plain value; all zeros for salt 0."""
    mesh = init_device_mesh("cpu", (world,))

    def v(seed, shape):
        return torch.randn(shape, generator=torch.Generator().manual_seed(seed * 100 + salt)) if salt else \
            torch.zeros(shape)
    return {"w": distribute_tensor(v(1, (7, 3)), mesh, [Shard(0)]),
            "r": distribute_tensor(v(2, (4,)), mesh, [Replicate()]),
            "p": v(3, (5,)), "n": 10 * salt}


def salts_of(world: int, sd: dict) -> dict:
    """For every key, the salt whose value sd holds (0: none)."""
    full = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in sd.items()}
    out = {}
    for salt in SALTS:
        ref = state(world, salt)
        for k, v in ref.items():
            v = v.full_tensor() if isinstance(v, DTensor) else v
            same = torch.equal(v, full[k]) if isinstance(v, torch.Tensor) else v == full[k]
            if same:
                out[k] = salt
    return {k: out.get(k, 0) for k in full}


class FailingWriter(rewind.dcp.Writer):
    """A writer whose rank fails in the middle of the save: in write_data,
    when the other ranks write (and commit) theirs."""

    def write_data(self, plan, planner):
        raise RuntimeError("injected failure in write_data")


def main() -> None:
    faulthandler.dump_traceback_later(240, exit=True)  # a hung rank prints where, and ends
    p = argparse.ArgumentParser()
    for a in ("action", "rank", "world", "port", "out"):
        p.add_argument(a)
    p.add_argument("--salt", type=int, default=0)
    p.add_argument("--step", type=int)
    p.add_argument("--fail-rank", type=int)
    args = p.parse_args()
    rank, world, out = int(args.rank), int(args.world), args.out
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=world)
    res: dict = {"rank": rank, "error": None}
    if args.action == "save":
        writer = FailingWriter if rank == args.fail_rank else rewind.dcp.Writer
        try:
            dcp.save(state(world, args.salt), storage_writer=writer(step=args.step))
        except BaseException as e:  # CheckpointException is a BaseException
            res["error"] = f"{type(e).__name__}: {e}"
    elif args.action == "load":
        sd = state(world, 0)
        reader = rewind.dcp.Reader(step=args.step)
        try:
            dcp.load(sd, storage_reader=reader)
            res["salts"] = salts_of(world, sd)
            res["loaded_step"] = reader.loaded_step
        except BaseException as e:  # CheckpointException is a BaseException
            res["error"] = f"{type(e).__name__}: {e}"
    else:
        raise SystemExit(f"unknown action {args.action}")
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
        json.dump(res, f)
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # not destroy_process_group: with gloo it sometimes never returns


if __name__ == "__main__":
    main()
