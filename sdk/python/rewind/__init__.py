"""rewind: save and restore PyTorch training state through the rewind node
agent, at the speed of a memory copy into shared memory.

    import rewind
    client = rewind.Client()            # socket, job, rank from the environment
    step, state = client.restore() if client.latest() is not None else (0, None)
    ...
    client.save(step, {"model": model.state_dict(), "optim": opt.state_dict()})

rewind.load_shard(path) reads a shard file without any agent.
"""

from .client import DEFAULT_SOCKET, Client, SaveStats
from .errors import (
    BusyError,
    CoordinatorUnavailableError,
    CorruptError,
    DeadlineError,
    GangBrokenError,
    InvalidError,
    NoAgentError,
    NotFoundError,
    ResourceExhaustedError,
    RewindError,
)
from .format import Header, ShardMeta, TensorInfo
from .shard import load_shard, load_state


__version__ = "0.1.0"

__all__ = [
    "Client", "SaveStats", "DEFAULT_SOCKET", "load_shard", "load_state", "Header", "ShardMeta", "TensorInfo",
    "RewindError", "GangBrokenError", "NoAgentError", "NotFoundError", "ResourceExhaustedError", "CorruptError", "InvalidError",
    "BusyError", "DeadlineError", "CoordinatorUnavailableError",
]
