"""rewind.dcp against real DCP: dcp.save, dcp.async_save and dcp.load of
DTensor model and optimizer state across several gloo processes on the
CPU, through a real agent, at the saved world size and at others.

Needs torch 2.x (make test-python-dcp runs it in a Debian trixie root);
skipped on an older torch."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import rewind

pytest.importorskip("torch.distributed.checkpoint.metadata", reason="needs torch 2.x")
try:
    import rewind.dcp
except ImportError as e:
    pytest.skip(f"rewind.dcp: {e}", allow_module_level=True)

WORKER = Path(__file__).with_name("dcp_worker.py")
TIMEOUT = 300  # seconds for one gang of workers: several torch imports on two loaded cores


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gang(action: str, world: int, agent, job: str, out: Path, *extra: str) -> list[dict]:
    """Runs world ranks of the worker and returns what each wrote."""
    env = dict(os.environ, REWIND_SOCKET=agent.socket, REWIND_JOB=job, USE_LIBUV="0", GLOO_SOCKET_IFNAME="lo",
               OMP_NUM_THREADS="1")
    for k in ("REWIND_RANK", "REWIND_WORLD_SIZE", "RANK", "WORLD_SIZE"):
        env.pop(k, None)
    port = free_port()
    logs = [out / f"{action}-{world}-{r}.log" for r in range(world)]
    procs = []
    for r in range(world):
        with open(logs[r], "w") as log:
            procs.append(subprocess.Popen([sys.executable, str(WORKER), action, str(r), str(world), str(port), str(out),
                                           *extra], stdout=log, stderr=subprocess.STDOUT, env=env))
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=TIMEOUT))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            codes.append("timeout")
    if any(c != 0 for c in codes):
        tails = "\n".join(f"--- rank {r} ({c}):\n{logs[r].read_text()[-3000:]}" for r, c in enumerate(codes))
        pytest.fail(f"{action} at world size {world}: exit codes {codes}\n{tails}")
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(world)]


def stored_items(client: rewind.Client, step: int) -> tuple[Counter, int, int]:
    """Every (fqn, offsets) stored in the step's shards, how many times;
    the shards' world size and their data bytes."""
    seen: Counter = Counter()
    world, nbytes = None, 0
    r = 0
    while world is None or r < world:
        with client.open_shard(r, step) as sh:
            world = sh.header.meta.world_size
            doc = json.loads(sh.header.objects)
            assert doc["format"] == rewind.dcp.DOC_FORMAT
            for t in sh.header.tensors:
                offs = tuple(t.chunk["offsets"]) if t.chunk else None
                seen[(doc["items"][t.name]["fqn"], offs)] += 1
                nbytes += t.nbytes
        r += 1
    return seen, world, nbytes


@pytest.fixture(scope="module")
def saved(agent, tmp_path_factory):
    """A checkpoint of step 7 saved by dcp.save at world size 4."""
    out = tmp_path_factory.mktemp("dcp")
    job = f"dcp-{os.getpid()}"
    gang("save", 4, agent, job, out, "7")
    return job, out


def check_loaded(results: list[dict], world: int) -> None:
    for res in results:
        assert res["missing"] == [] and res["mismatch"] == [], res
        assert res["loaded_step"] == 7 and res["saved_world_size"] == 4
        assert len(res["keys"]) > 20  # model, exp_avg, exp_avg_sq, step, param_groups, extra


@pytest.mark.parametrize("world", [4, 2, 3])
def test_load_at_world_size(saved, agent, world):
    """Saved at 4, loaded at 4, 2 and 3 (uneven: 4100 rows, 22 columns and
    16 rows over 3 ranks): every value equals the full tensors saved."""
    job, out = saved
    results = gang("load", world, agent, job, out)
    check_loaded(results, world)
    if world == 3:
        assert "Shard(dim=1)" in results[0]["placements"]["b.weight"]


def test_replicated_items_stored_once(saved, agent):
    """DCP's planner gives each replicated item (a Replicate DTensor, the
    optimizer's step, param_groups, the extra state) to one rank: across
    the four shards every item and piece is stored exactly once."""
    job, _ = saved
    with rewind.Client(socket=agent.socket, job=job, rank=0, world_size=4) as c:
        seen, world, nbytes = stored_items(c, 7)
    assert world == 4
    assert [k for k, n in seen.items() if n != 1] == []
    assert seen[("model.b.bias", (0,))] == 1  # Replicate: one copy, not four
    assert seen[("optim.state.b.bias.exp_avg", (0,))] == 1
    assert sum(1 for fqn, _ in seen if fqn == "model.big.weight") == 4  # Shard(0): one piece per rank
    # The bytes are the model and two Adam moments once, not once per rank.
    params = 4100 * 160 + 16 * 8 + 16 + 4 * 22 + 4
    assert 3 * params * 4 <= nbytes < 3 * params * 4 + 16384


def test_async_save_then_load(agent, tmp_path):
    """dcp.async_save through the writer returns before the save is done;
    its future's completion leaves a checkpoint that loads."""
    job = f"dcp-async-{os.getpid()}"
    results = gang("async_save", 4, agent, job, tmp_path, "7")
    assert all(r["blocked_s"] <= r["save_s"] for r in results)
    check_loaded(gang("load", 3, agent, job, tmp_path), 3)


def test_checkpoint_id():
    assert rewind.dcp.parse_checkpoint_id("rewind://job-1") == ("job-1", None)
    assert rewind.dcp.parse_checkpoint_id("rewind://job-1/step-300") == ("job-1", 300)
    assert rewind.dcp.parse_checkpoint_id(os.path.join("rewind://j", "42")) == ("j", 42)
    assert rewind.dcp.Writer.validate_checkpoint_id("rewind://j/step-3")
    assert rewind.dcp.Reader.validate_checkpoint_id("rewind://j")
    for bad in ("/tmp/ckpt", "rewind://", "rewind://j/x/y", "rewind://j/latest", "rewind://bad job", 3):
        assert not rewind.dcp.Writer.validate_checkpoint_id(bad), bad
    w = rewind.dcp.Writer()
    w.reset("rewind://j2/step-9")
    assert (w.job, w.step, w.checkpoint_id) == ("j2", 9, "rewind://j2/step-9")
