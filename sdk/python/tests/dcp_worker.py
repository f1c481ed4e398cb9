"""One rank of a DCP test (tests/test_dcp.py starts world-size many).

    dcp_worker.py ACTION RANK WORLD PORT OUT [STEP]

ACTION: save (dcp.save through rewind.dcp.Writer), async_save
(dcp.async_save), load (dcp.load through rewind.dcp.Reader, compared with
the reference the save wrote), fs_save DIR (FileSystemWriter, for the
benchmark). The agent's socket and the job come from REWIND_SOCKET and
REWIND_JOB; REWIND_DCP_DEVICE=cuda puts the state on the GPUs (NCCL, one
GPU per rank), else the CPU (gloo); REWIND_DCP_MODEL=fsdp2 makes the
model an nn.Module sharded with FSDP2's fully_shard instead (see
build_fsdp2). A rank writes what it measured to OUT/rank-N.json.

The state: a model of DTensor parameters on a CPU device mesh (Shard(0),
Shard(1) and Replicate placements, dimensions that do not divide by 3),
an Adam optimizer after one step (exp_avg, exp_avg_sq as DTensors, step
as a replicated tensor, param_groups as non-tensor items), and extra
state: a replicated tensor, plain values and a complex128 DTensor. Every
value is the same seeded full tensor at any world size.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import rewind.dcp  # noqa: E402

# name -> (full shape, placement); "big" spans several 1 MiB checksum leaves per rank.
PARAMS = {
    "big.weight": ((4100, 160), Shard(0)),
    "a.weight": ((16, 8), Shard(0)),
    "a.bias": ((16,), Shard(0)),
    "b.weight": ((4, 22), Shard(1)),
    "b.bias": ((4,), Replicate()),
}


def full(name: str, salt: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(sum(map(ord, name)) * 131 + salt)
    return torch.randn(PARAMS[name][0], generator=g)


class Model(torch.nn.Module):
    def __init__(self, mesh, salt: int):
        super().__init__()
        for name, (_, place) in PARAMS.items():
            mod, attr = name.split(".")
            if not hasattr(self, mod):
                self.add_module(mod, torch.nn.Module())
            value = full(name, salt) if salt else torch.zeros(PARAMS[name][0])
            getattr(self, mod).register_parameter(attr, torch.nn.Parameter(distribute_tensor(value, mesh, [place])))


def build(mesh, trained: bool):
    """The model and optimizer; trained: after one Adam step with seeded
    gradients (the state saved), else zeros (the state loaded into)."""
    if os.environ.get("REWIND_DCP_MODEL") == "fsdp2":
        return build_fsdp2(mesh, trained)
    model = Model(mesh, 1 if trained else 0)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, foreach=False)
    if trained:
        for name, p in model.named_parameters():
            p.grad = distribute_tensor(full(name, 2), mesh, [PARAMS[name][1]])
        opt.step()
        opt.zero_grad()
    return model, opt


# Layer widths of the FSDP2 model: 4100 rows span several 1 MiB checksum
# leaves per rank; 22, 37 and 5 divide by neither 2, 3 nor 4 (FSDP2 pads
# its dim-0 shards, the last rank's shorter or empty).
FSDP2_WIDTHS = (64, 4100, 22, 37, 5)


def build_fsdp2(mesh, trained: bool):
    """An nn.Sequential of Linear layers (seeded init, the same at any world
    size) sharded by FSDP2: fully_shard on each Linear and on the root, as
    torchtitan does per block. trained: after one Adam step, after a
    forward and backward of a seeded batch (gradients reduce-scattered by
    FSDP2) where FSDP2 runs on the device (the GPU; the CPU from the torch
    whose CPU streams record events, as 2.14's do), else with seeded
    gradients; not trained: a fresh model with other values."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch 2.4-2.5: the composable API's module
        from torch.distributed._composable.fsdp import fully_shard
    torch.manual_seed(1 if trained else 99)
    layers = [torch.nn.Linear(a, b) for a, b in zip(FSDP2_WIDTHS, FSDP2_WIDTHS[1:])]
    model = torch.nn.Sequential(*layers).to(mesh.device_type)
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, foreach=False)
    if trained and (mesh.device_type == "cuda" or hasattr(torch.cpu.Stream, "record_event")):
        x = torch.randn(8, FSDP2_WIDTHS[0], generator=torch.Generator().manual_seed(7)).to(mesh.device_type)
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    elif trained:  # torch 2.6's FSDP2 cannot run forward on the CPU: gradients set as its backward leaves them
        for p in model.parameters():
            g = torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel()))
            p.grad = distribute_tensor(g, p.device_mesh, p.placements)
        opt.step()
        opt.zero_grad()
    return model, opt


def state(model, opt, trained: bool) -> dict:
    msd, osd = get_state_dict(model, opt)
    # A complex128 DTensor (a dtype the shard format has no name for: its
    # pieces are stored as bytes), 7 rows over any world size.
    g = torch.Generator().manual_seed(5)
    spectrum = torch.randn(7, 3, dtype=torch.complex128, generator=g) if trained else torch.zeros(7, 3, dtype=torch.complex128)
    mesh = next(iter(msd.values())).device_mesh
    extra = {"rng": torch.arange(10, dtype=torch.int64) * (7 if trained else 0), "epoch": 3 if trained else 0,
             "note": "saved" if trained else "",
             "spectrum": complex_dtensor(spectrum, mesh)}
    return {"model": msd, "optim": osd, "extra": extra}


def complex_dtensor(full, mesh):
    """full as a Shard(0) DTensor made without a collective: gloo moves no
    complex tensors. Each rank's rows are torch.chunk's, as DTensor's."""
    world = mesh.size()
    pieces = list(torch.chunk(full, world, dim=0))
    pieces += [full[:0]] * (world - len(pieces))
    return DTensor.from_local(pieces[mesh.get_local_rank()].to(mesh.device_type), mesh, [Shard(0)], run_check=False,
                              shape=full.shape, stride=full.stride())


def flat(d, prefix=""):
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            yield from flat(v, key + "/")
        elif isinstance(v, list):
            yield from flat(dict(enumerate(v)), key + "/")
        else:
            yield key, v


def whole(v):
    """The full value on the CPU (a reference compares across devices), a
    copy: a replicated piece's full tensor is the piece itself."""
    if isinstance(v, DTensor) and v.dtype.is_complex:  # gathered as objects: gloo moves no complex tensors
        pieces = [None] * dist.get_world_size()
        dist.all_gather_object(pieces, v.to_local().cpu())
        return torch.cat(pieces)
    v = v.full_tensor() if isinstance(v, DTensor) else v
    return v.cpu().clone() if isinstance(v, torch.Tensor) else v


def next_step(sd) -> None:
    """What a training loop does right after dcp.async_save returns: its
    next optimizer step changes every tensor of the state in place (here
    each local value plus one, with no collective, beside the save's)."""
    with torch.no_grad():
        for _, v in flat(sd):
            if isinstance(v, torch.Tensor):
                (v.to_local() if isinstance(v, DTensor) else v).add_(1)


def async_kwargs(action: str) -> dict:
    """async_save's executor and stager: DCP's checkpoint process (torch
    2.7 and later) with the writer staging, or with DCP's DefaultStager
    staging and the writer sent to that process (torchtitan's
    async_with_pinned_mem)."""
    if not action.startswith("async_save_process"):
        return {}
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")  # where that process's group meets (torchrun sets it)
    kw: dict = {"async_checkpointer_type": AsyncCheckpointerType.PROCESS}
    if action.endswith("_stager"):
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
        kw["async_stager"] = DefaultStager(StagingOptions(False, False, False, False))
    return kw


def main() -> None:
    faulthandler.dump_traceback_later(240, exit=True)  # a hung rank prints where, and ends
    action, rank, world, port, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    step = int(sys.argv[6]) if len(sys.argv) > 6 else 1
    device = os.environ.get("REWIND_DCP_DEVICE", "cpu")  # cuda: NCCL, one GPU a rank
    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world)
    mesh = init_device_mesh(device, (world,))
    res: dict = {"rank": rank, "device": device}
    if action in ("save", "save_alone", "save_no_dist", "async_save", "async_save_process", "async_save_process_stager",
                  "fs_save"):
        model, opt = build(mesh, True)
        sd = state(model, opt, True)
        if action.endswith("_stager"):  # DCP's DefaultStager (torch 2.14) fails on a local piece that views a
            v = sd["extra"]["spectrum"]  # larger tensor ("copy_() on an invalid python storage"): its own here
            sd["extra"]["spectrum"] = DTensor.from_local(v.to_local().clone(), v.device_mesh, v.placements,
                                                         run_check=False, shape=v.shape, stride=v.stride())
        ref = {k: whole(v) for k, v in flat(sd)}
        dist.barrier()
        t0 = time.perf_counter()
        if action == "save":
            dcp.save(sd, storage_writer=rewind.dcp.Writer(step=step))
        elif action == "save_alone":  # each rank plans alone, naming its rank (torch 2.14)
            dcp.save(sd, storage_writer=rewind.dcp.Writer(step=step), use_collectives=False)
        elif action == "save_no_dist":  # each process saves as if it were the only one (rank 0 of 1), in turn
            for turn in range(world):
                if turn == rank:
                    dcp.save(sd, storage_writer=rewind.dcp.Writer(step=step), no_dist=True)
                dist.barrier()
        elif action == "fs_save":
            dcp.save(sd, storage_writer=dcp.FileSystemWriter(sys.argv[7]))
        else:
            fut = dcp.async_save(sd, storage_writer=rewind.dcp.Writer(step=step), **async_kwargs(action))
            res["blocked_s"] = time.perf_counter() - t0
            next_step(sd)  # the loop goes on while the save completes
            getattr(fut, "upload_completion", fut).result()
        res["save_s"] = time.perf_counter() - t0
        if rank == 0:
            torch.save(ref, os.path.join(out, "reference.pt"))
    elif action == "load_refused":  # a load that must fail: its error
        model, opt = build(mesh, False)
        try:
            dcp.load(state(model, opt, False), storage_reader=rewind.dcp.Reader())
            res["error"] = None
        except BaseException as e:  # DCP's CheckpointException is a BaseException
            res["error"] = f"{type(e).__name__}: {e}"
    elif action == "load":
        model, opt = build(mesh, False)
        sd = state(model, opt, False)
        reader = rewind.dcp.Reader()
        dcp.load(sd, storage_reader=reader)
        set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        got = {k: whole(v) for k, v in flat(state(model, opt, False) | {"extra": sd["extra"]})}
        ref = torch.load(os.path.join(out, "reference.pt"), weights_only=False)
        res["keys"] = sorted(ref)
        res["mismatch"] = sorted(k for k in ref if k not in got or not _equal(ref[k], got[k]))
        res["missing"] = sorted(set(ref) - set(got))
        res["loaded_step"] = reader.loaded_step
        res["saved_world_size"] = reader.saved_world_size
        res["placements"] = {n: str(p.placements) for n, p in model.named_parameters()}
        res["param_device"] = str(next(model.parameters()).device)
    else:
        raise SystemExit(f"unknown action {action}")
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
        json.dump(res, f)
    dist.barrier()
    # Not destroy_process_group: with gloo it sometimes never returns on
    # one rank after the others have gone. Everything is written.
    sys.stdout.flush()
    os._exit(0)


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    return a == b


if __name__ == "__main__":
    main()
