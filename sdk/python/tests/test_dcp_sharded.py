"""rewind.dcp with ShardedTensor state (FSDP1's SHARDED_STATE_DICT): saved
through the writer, with dcp.save and with dcp.async_save, and loaded at
its own and at other world sizes (uneven rows), against real agents."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed.checkpoint.metadata", reason="needs torch 2.x")
pytest.importorskip("torch.distributed._shard.sharded_tensor", reason="this torch has no ShardedTensor")

from test_dcp import _process_executor, gang  # noqa: E402

WORKER = Path(__file__).with_name("dcp_sharded_worker.py")


def loaded(results: list[dict], world: int) -> None:
    rows = 0
    for r in results:
        assert r["plain"], r
        for r0, n, equal in r["shards"]:
            assert equal, (r0, n, r)
            rows += n
    assert rows == 11 and len(results) == world


@pytest.mark.parametrize("how", ["save", "async_save"])
def test_sharded_tensor_saved_and_loaded_at_other_world_sizes(agent, tmp_path, how):
    """A ShardedTensor chunked over 2 ranks (6 and 5 rows) and a plain
    tensor, saved as step 3 (async_save: every value changed right after
    the call): loaded at 2, 3 and 4 ranks, every rank's rows equal to the
    saved tensor's."""
    job = f"dcp-sharded-{how}-{os.getpid()}"
    gang(how, 2, agent, job, tmp_path, "3", worker=WORKER)
    for world in (2, 3, 4):
        loaded(gang("load", world, agent, job, tmp_path, worker=WORKER), world)


@pytest.mark.skipif(not _process_executor(), reason="this torch's async_save has no process executor (torch 2.7+)")
def test_sharded_tensor_through_dcps_checkpoint_process_is_refused(agent, tmp_path):
    """The writer stages a ShardedTensor's shards for a save in the
    training process only: async_save through DCP's checkpoint process
    fails on every rank naming the ShardedTensor and what to use instead,
    rather than write live values."""
    job = f"dcp-sharded-process-{os.getpid()}"
    for r in gang("async_save_process", 2, agent, job, tmp_path, "3", worker=WORKER):
        assert r["error"] and "ShardedTensor" in r["error"] and "DefaultStager" in r["error"], r
