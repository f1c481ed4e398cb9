"""One rank of the ShardedTensor tests (tests/test_dcp_sharded.py starts
world-size many): the state FSDP1's SHARDED_STATE_DICT gives, a
ShardedTensor chunked on dim 0 across the ranks, beside a plain tensor.

    dcp_sharded_worker.py ACTION RANK WORLD PORT OUT [STEP]

save, async_save: the state saved as STEP through rewind.dcp.Writer
(async_save: every local value changed right after the call, before its
future is waited on); async_save_process: through DCP's checkpoint
process (torch 2.7+), its error, if any, written; load: a zero state of this world size's sharding
loaded through rewind.dcp.Reader. Each rank writes to OUT/rank-N.json
whether each loaded local shard equals its rows of the saved tensor.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed._shard import sharded_tensor
from torch.distributed._shard.sharding_spec import ChunkShardingSpec

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import rewind.dcp  # noqa: E402

ROWS, COLS = 11, 3  # uneven over 2, 3 and 4 ranks


def full() -> torch.Tensor:
    return torch.arange(ROWS * COLS, dtype=torch.float32).reshape(ROWS, COLS) * 1.5


def state(world: int, values: bool) -> dict:
    spec = ChunkShardingSpec(dim=0, placements=[f"rank:{r}/cpu" for r in range(world)])
    st = sharded_tensor.zeros(spec, ROWS, COLS)
    if values:
        with torch.no_grad():
            for sh in st.local_shards():
                r0, n = sh.metadata.shard_offsets[0], sh.metadata.shard_sizes[0]
                sh.tensor.copy_(full()[r0:r0 + n])
    return {"st": st, "plain": torch.arange(5.0) if values else torch.zeros(5)}


def main() -> None:
    faulthandler.dump_traceback_later(240, exit=True)
    action, rank, world, port, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    step = int(sys.argv[6]) if len(sys.argv) > 6 else 1
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    res: dict = {"rank": rank}
    if action == "save":
        dcp.save(state(world, True), storage_writer=rewind.dcp.Writer(step=step))
    elif action == "async_save":
        sd = state(world, True)
        fut = dcp.async_save(sd, storage_writer=rewind.dcp.Writer(step=step))
        with torch.no_grad():  # the loop's next step, in place
            for sh in sd["st"].local_shards():
                sh.tensor.add_(100)
            sd["plain"].add_(100)
        fut.result()
    elif action == "async_save_process":
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        try:
            r = dcp.async_save(state(world, True), storage_writer=rewind.dcp.Writer(step=step),
                               async_checkpointer_type=AsyncCheckpointerType.PROCESS)
            getattr(r, "upload_completion", r).result()
            res["error"] = None
        except BaseException as e:
            res["error"] = f"{type(e).__name__}: {e}"
    elif action == "load":
        sd = state(world, False)
        dcp.load(sd, storage_reader=rewind.dcp.Reader())
        res["shards"] = []
        for sh in sd["st"].local_shards():
            r0, n = sh.metadata.shard_offsets[0], sh.metadata.shard_sizes[0]
            res["shards"].append([r0, n, bool(torch.equal(sh.tensor, full()[r0:r0 + n]))])
        res["plain"] = bool(torch.equal(sd["plain"], torch.arange(5.0)))
    else:
        raise SystemExit(f"unknown action {action}")
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
        json.dump(res, f)
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
