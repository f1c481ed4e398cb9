"""Which job, rank and world size a process is.

Each of rank and world size comes from the first of: the argument;
REWIND_RANK / REWIND_WORLD_SIZE; torch.distributed, if it is initialized;
Open MPI's OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE (an MPIJob sets
them); torchrun's RANK / WORLD_SIZE; else 0 and 1 (a single process). The
job id comes from the argument or REWIND_JOB and is required.
"""

from __future__ import annotations

import os

from . import format as fmt
from .errors import InvalidError


def _env_int(name: str) -> int | None:
    v = os.environ.get(name, "")
    if v == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise InvalidError("client", f"{name}={v!r} is not a number") from None


def _distributed() -> tuple[int | None, int | None]:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:  # a broken or partial torch.distributed is no identity
        pass
    return None, None


def _first(*vals):
    return next((v for v in vals if v is not None), None)


def resolve(job: str | None, rank: int | None, world_size: int | None) -> tuple[str, int, int]:
    """Returns (job, rank, world_size), or raises InvalidError."""
    job = job or os.environ.get("REWIND_JOB", "")
    if not job:
        raise InvalidError("client", "no job id: pass job= or set REWIND_JOB")
    fmt.validate_job(job)
    drank, dsize = _distributed() if rank is None or world_size is None else (None, None)
    rank = _first(rank, _env_int("REWIND_RANK"), drank, _env_int("OMPI_COMM_WORLD_RANK"), _env_int("RANK"), 0)
    world_size = _first(world_size, _env_int("REWIND_WORLD_SIZE"), dsize, _env_int("OMPI_COMM_WORLD_SIZE"),
                        _env_int("WORLD_SIZE"), 1)
    if not 0 <= rank < world_size or world_size >= 1 << 32:
        raise InvalidError("client", f"rank {rank} out of range for world size {world_size}")
    return job, int(rank), int(world_size)
