"""rewind: save and restore PyTorch training state through the rewind node
agent, at the speed of a memory copy into shared memory.

    import rewind
    client = rewind.Client()            # socket, job, rank from the environment
    step, state = client.restore() if client.latest() is not None else (0, None)
    ...
    client.save(step, {"model": model.state_dict(), "optim": opt.state_dict()})

rewind.load_shard(path) reads a shard file without any agent.
"""

from typing import TYPE_CHECKING, Any

from ._pb.agent_pb2 import ShardState
from .errors import (
    BusyError,
    CoordinatorUnavailableError,
    CorruptError,
    DeadlineError,
    GangBrokenError,
    InvalidError,
    NoAgentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    RewindError,
)
from .format import Header, ShardMeta, TensorInfo
from .identity import kube_job_id

if TYPE_CHECKING:
    from .client import DEFAULT_SOCKET, Client, SaveStats
    from .reshard import Layout, Resharded, Slice
    from .shard import load_shard, load_state

__version__ = "0.1.0"
"""The package's version, written only here (pyproject.toml reads it)."""

# What needs torch is imported when first used (PEP 562), so that
# ``import rewind`` stays light: the client and the shard readers build
# torch tensors, the errors and the header format do not.
_LAZY = {
    "Client": ".client", "SaveStats": ".client", "DEFAULT_SOCKET": ".client",
    "load_shard": ".shard", "load_state": ".shard",
    "Layout": ".reshard", "Slice": ".reshard", "Resharded": ".reshard",
}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(mod, __name__), name)
    globals()[name] = value  # once: later reads skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "Client", "SaveStats", "DEFAULT_SOCKET", "load_shard", "load_state", "Header", "ShardMeta", "TensorInfo",
    "Layout", "Slice", "Resharded",
    "ShardState",
    "RewindError", "GangBrokenError", "NoAgentError", "NotFoundError", "ResourceExhaustedError", "CorruptError", "InvalidError", "PermissionDeniedError",
    "BusyError", "DeadlineError", "CoordinatorUnavailableError", "kube_job_id",
]
