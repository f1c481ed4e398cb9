"""One rank of a DCP failure test (tests/test_dcp_failures.py starts
world-size many).

    dcp_failures_worker.py ACTION RANK WORLD PORT OUT --salt S [--step N] [--fail-rank R]
        [--salt2 S2] [--stale-rank R]

save: dcp.save of the state for salt S (every value depends on it) as
step N through rewind.dcp.Writer; with --fail-rank R, rank R's writer
raises in write_data, after the other ranks' shards may be committed.
save-twice: two dcp.save of step N, salts S then S2, through one Writer
per rank and no checkpoint_id (a retry loop); --fail-rank R: rank R's
writer raises in the second save's write_data; --stale-rank R: rank R's
planner gives the first save's plan again in the second (as DCP's plan
caching does when a rank's plan has not changed).
load: dcp.load through rewind.dcp.Reader (step N, else the latest) into a
zero state, and, for every key, the salt of which the loaded value is
(0: none of 1-9).
load-racing: load, while another save of step N commits between rank
0's read of the step's shard headers and rank 1's (rank 1 saves it, its
floating-point values negated, with a save id of its own).
save-alone, load-alone: as save and load, without torch.distributed:
each process is its own DCP coordinator, its rank REWIND_RANK, and saves
keys of its own (p{RANK}, n{RANK}); load-alone loads every rank's keys.
A rank writes what it saw to OUT/rank-N.json.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
import uuid

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
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


def alone_state(world: int, ranks, salt: int) -> dict:
    """The keys of each of ranks when saved without torch.distributed: a
    tensor and a plain value; all zeros for salt 0."""
    out: dict = {}
    for r in ranks:
        g = torch.Generator().manual_seed((10 + r) * 100 + salt)
        out[f"p{r}"] = torch.randn((5,), generator=g) if salt else torch.zeros(5)
        out[f"n{r}"] = 10 * salt + r if salt else 0
    return out


def salts_of(world: int, sd: dict, ref_state=None) -> dict:
    """For every key, the salt whose value sd holds (0: none)."""
    ref_state = ref_state or (lambda salt: state(world, salt))
    full = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in sd.items()}
    out = {}
    for salt in SALTS:
        ref = ref_state(salt)
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


class FailingSecondWriter(rewind.dcp.Writer):
    """A writer that fails in the write_data of its second save."""

    saves = 0

    def write_data(self, plan, planner):
        self.saves += 1
        if self.saves == 2:
            raise RuntimeError("injected failure in the second write_data")
        return super().write_data(plan, planner)


class StalePlanner(DefaultSavePlanner):
    """Gives its first save's final plan in every later save, as DCP's plan
    caching (DefaultSavePlanner(enable_plan_caching=True), torch 2.8) does
    for a rank whose local plan has not changed."""

    first = None

    def finish_plan(self, new_plan):
        if StalePlanner.first is None:
            StalePlanner.first = super().finish_plan(new_plan)
        self.plan = StalePlanner.first
        return self.plan


def save_again(step: int) -> None:
    """Every saved rank's shard of step saved once more, as another
    dcp.save of it would: its floating-point values negated, a new save
    id in its objects document."""
    job, save = os.environ["REWIND_JOB"], uuid.uuid4().hex
    with rewind.Client(job=job) as c:
        with c.open_shard(0, step) as sh:
            world = sh.header.meta.world_size
    for r in range(world):
        with rewind.Client(job=job, rank=r, world_size=world) as c:
            with c.open_shard(r, step) as sh:
                tensors = {}
                for t in sh.header.tensors:
                    v = sh.view(t.name).clone().reshape(t.shape)
                    tensors[t.name] = -v if v.is_floating_point() else v
                chunks = {t.name: t.chunk for t in sh.header.tensors if t.chunk}
                doc = json.loads(sh.header.objects)
            doc["save"] = save
            c.save_tensors(step, tensors, objects=json.dumps(doc).encode(), chunks=chunks)


class RacingReader(rewind.dcp.Reader):
    """Rank 0 reads the step's shard headers, then rank 1 saves the step
    again and reads them: each rank's set is whole, of another save."""

    def read_metadata(self):
        if dist.get_rank() == 0:
            meta = super().read_metadata()
            dist.barrier()
            return meta
        dist.barrier()
        save_again(self.step)
        return super().read_metadata()


def error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def main() -> None:
    faulthandler.dump_traceback_later(240, exit=True)  # a hung rank prints where, and ends
    p = argparse.ArgumentParser()
    for a in ("action", "rank", "world", "port", "out"):
        p.add_argument(a)
    p.add_argument("--salt", type=int, default=0)
    p.add_argument("--step", type=int)
    p.add_argument("--fail-rank", type=int)
    p.add_argument("--salt2", type=int, default=0)
    p.add_argument("--stale-rank", type=int)
    args = p.parse_args()
    rank, world, out = int(args.rank), int(args.world), args.out
    alone = args.action.endswith("-alone")
    if alone:  # no process group: the rank comes from the environment
        os.environ.update(REWIND_RANK=str(rank), REWIND_WORLD_SIZE=str(world))
    else:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=world)
    res: dict = {"rank": rank, "error": None}
    if args.action == "save":
        writer = FailingWriter if rank == args.fail_rank else rewind.dcp.Writer
        try:
            dcp.save(state(world, args.salt), storage_writer=writer(step=args.step))
        except BaseException as e:  # CheckpointException is a BaseException
            res["error"] = error(e)
    elif args.action == "save-twice":
        w = (FailingSecondWriter if rank == args.fail_rank else rewind.dcp.Writer)(step=args.step)
        res["error2"] = None
        for key, salt in (("error", args.salt), ("error2", args.salt2)):
            planner = StalePlanner() if rank == args.stale_rank else DefaultSavePlanner()
            try:
                dcp.save(state(world, salt), storage_writer=w, planner=planner)
            except BaseException as e:  # CheckpointException is a BaseException
                res[key] = error(e)
    elif args.action == "save-alone":
        try:
            dcp.save(alone_state(world, [rank], args.salt), storage_writer=rewind.dcp.Writer(step=args.step))
        except BaseException as e:
            res["error"] = error(e)
    elif args.action == "load-alone":
        sd = alone_state(world, range(world), 0)
        reader = rewind.dcp.Reader(step=args.step)
        try:
            dcp.load(sd, storage_reader=reader)
            res["salts"] = salts_of(world, sd, lambda salt: alone_state(world, range(world), salt))
            res["loaded_step"] = reader.loaded_step
        except BaseException as e:
            res["error"] = error(e)
    elif args.action in ("load", "load-racing"):
        sd = state(world, 0)
        reader = (RacingReader if args.action == "load-racing" else rewind.dcp.Reader)(step=args.step)
        try:
            dcp.load(sd, storage_reader=reader)
            res["salts"] = salts_of(world, sd)
            res["loaded_step"] = reader.loaded_step
        except BaseException as e:  # CheckpointException is a BaseException
            res["error"] = error(e)
    else:
        raise SystemExit(f"unknown action {args.action}")
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
        json.dump(res, f)
    if not alone:
        dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # not destroy_process_group: with gloo it sometimes never returns


if __name__ == "__main__":
    main()
