"""Which job, rank and world size a process is.

Each of rank and world size comes from the first of: the argument;
REWIND_RANK / REWIND_WORLD_SIZE; torch.distributed, if it is initialized;
Open MPI's OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE (an MPIJob sets
them); torchrun's RANK / WORLD_SIZE; else 0 and 1 (a single process). The
job id comes from the argument, REWIND_JOB, or the Kubernetes job named by
REWIND_NAMESPACE and REWIND_JOB_NAME (kube_job_id), and is required.
"""

from __future__ import annotations

import hashlib
import os
import re

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


_DNS_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?")


def kube_job_id(namespace: str, name: str) -> str:
    """The job id of the Kubernetes training job `name` in `namespace`, as
    the rewind controller registers it: "NAMESPACE.NAME", or, past the job
    id limit, as much of the name as fits, "_" and 16 hex digits of the
    SHA-256 of "NAMESPACE/NAME". The Go function shm.KubeJobID is the same;
    both are held to shm/testdata/kube_job_ids."""
    if len(namespace) > 63 or not _DNS_LABEL.fullmatch(namespace):
        raise InvalidError("job", f"namespace {namespace!r} is not a Kubernetes namespace (a DNS label: 1-63 of a-z, 0-9, '-')")
    if len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
        raise InvalidError("job", f"job name {name!r} is not a Kubernetes object name (a DNS subdomain: 1-253 of a-z, 0-9, '-', '.')")
    job = f"{namespace}.{name}"
    if len(job) <= fmt.MAX_JOB_LEN:
        return job
    tail = "_" + hashlib.sha256(f"{namespace}/{name}".encode()).hexdigest()[:16]
    keep = fmt.MAX_JOB_LEN - len(namespace) - 1 - len(tail)
    return f"{namespace}.{name[:keep]}{tail}"


def _env_job() -> str:
    job = os.environ.get("REWIND_JOB", "")
    ns, name = os.environ.get("REWIND_NAMESPACE", ""), os.environ.get("REWIND_JOB_NAME", "")
    if job or not ns or not name:
        return job
    try:
        return kube_job_id(ns, name)
    except InvalidError as e:
        raise InvalidError("client", f"{e} (from REWIND_NAMESPACE and REWIND_JOB_NAME)") from None


def _distributed() -> tuple[int | None, int | None]:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:  # a broken or partial torch.distributed is no identity
        pass
    return None, None


def job_token(token: str | None) -> str:
    """The job's token, for an agent that isolates jobs: the argument, else
    REWIND_JOB_TOKEN, else the contents of the file REWIND_JOB_TOKEN_FILE
    names (a Kubernetes Secret's key, mounted), else "" (no token)."""
    if token:
        return token
    if os.environ.get("REWIND_JOB_TOKEN"):
        return os.environ["REWIND_JOB_TOKEN"]
    path = os.environ.get("REWIND_JOB_TOKEN_FILE", "")
    if not path:
        return ""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError as e:
        raise InvalidError("client", f"job token: {e}") from None


def _first(*vals: int | None, default: int) -> int:
    return next((v for v in vals if v is not None), default)


def resolve(job: str | None, rank: int | None, world_size: int | None) -> tuple[str, int, int]:
    """Returns (job, rank, world_size), or raises InvalidError."""
    job = job or _env_job()
    if not job:
        raise InvalidError("client", "no job id: pass job= or set REWIND_JOB (or REWIND_NAMESPACE and REWIND_JOB_NAME)")
    fmt.validate_job(job)
    drank, dsize = _distributed() if rank is None or world_size is None else (None, None)
    r = _first(rank, _env_int("REWIND_RANK"), drank, _env_int("OMPI_COMM_WORLD_RANK"), _env_int("RANK"), default=0)
    ws = _first(world_size, _env_int("REWIND_WORLD_SIZE"), dsize, _env_int("OMPI_COMM_WORLD_SIZE"),
                _env_int("WORLD_SIZE"), default=1)
    if not 0 <= r < ws or ws >= 1 << 32:
        raise InvalidError("client", f"rank {r} out of range for world size {ws}")
    return job, int(r), int(ws)
