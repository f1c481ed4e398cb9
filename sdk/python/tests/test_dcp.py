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
import time
from collections import Counter
from pathlib import Path

import pytest

import rewind
from rewind import shard

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


def gang(action: str, world: int, agents, job: str, out: Path, *extra: str, device: str = "cpu",
         worker: Path = WORKER) -> list[dict]:
    """Runs world ranks of the worker and returns what each wrote. agents:
    the agent of every rank, or a list of them (rank r uses agents[r]).
    device: where the ranks' state lives (cuda: NCCL, one GPU a rank)."""
    env = dict(os.environ, REWIND_JOB=job, USE_LIBUV="0", GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
               REWIND_DCP_DEVICE=device)
    for k in ("REWIND_RANK", "REWIND_WORLD_SIZE", "RANK", "WORLD_SIZE"):
        env.pop(k, None)
    port = free_port()
    logs = [out / f"{action}-{world}-{r}.log" for r in range(world)]
    procs = []
    for r in range(world):
        sock = (agents[r] if isinstance(agents, list) else agents).socket
        with open(logs[r], "w") as log:
            procs.append(subprocess.Popen([sys.executable, str(worker), action, str(r), str(world), str(port), str(out),
                                           *extra], stdout=log, stderr=subprocess.STDOUT,
                                          env=dict(env, REWIND_SOCKET=sock)))
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


def stored_items(client: rewind.Client, step: int) -> tuple[Counter, int, Counter]:
    """Every (fqn, offsets) stored in the step's shards, how many times;
    the shards' world size, and the data bytes stored per fqn."""
    seen: Counter = Counter()
    nbytes: Counter = Counter()
    world = None
    r = 0
    while world is None or r < world:
        with client.open_shard(r, step) as sh:
            world = sh.header.meta.world_size
            doc = json.loads(sh.header.objects)
            assert doc["format"] == rewind.dcp.DOC_FORMAT
            for t in sh.header.tensors:
                offs = tuple(t.chunk["offsets"]) if t.chunk else None
                seen[(doc["items"][t.name]["fqn"], offs)] += 1
                nbytes[doc["items"][t.name]["fqn"]] += t.nbytes
        r += 1
    return seen, world, nbytes


@pytest.fixture(scope="module")
def saved(agent, tmp_path_factory):
    """A checkpoint of step 7 saved by dcp.save at world size 4."""
    out = tmp_path_factory.mktemp("dcp")
    job = f"dcp-{os.getpid()}"
    gang("save", 4, agent, job, out, "7")
    return job, out


def check_loaded(results: list[dict], world: int, saved_world: int = 4) -> None:
    for res in results:
        assert res["missing"] == [] and res["mismatch"] == [], res
        assert res["loaded_step"] == 7 and res["saved_world_size"] == saved_world
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


def test_gpu_state_loads_on_gpu_and_on_cpu_ranks(agent, tmp_path):
    """DTensor state on a GPU (NCCL; one rank per GPU, as many ranks as
    GPUs up to 4) saved through the writer, which copies it off the GPU
    into the shard: it loads back onto the GPUs, and onto CPU ranks at two
    other world sizes, every value equal to the full tensors saved."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    gpus = min(torch.cuda.device_count(), 4)
    job = f"dcp-cuda-{os.getpid()}"
    gang("save", gpus, agent, job, tmp_path, "7", device="cuda")
    results = gang("load", gpus, agent, job, tmp_path, device="cuda")
    check_loaded(results, gpus, saved_world=gpus)
    assert all(r["param_device"].startswith("cuda") for r in results), results
    for world in (gpus + 1, gpus + 2):
        results = gang("load", world, agent, job, tmp_path)
        check_loaded(results, world, saved_world=gpus)
        assert all(r["param_device"] == "cpu" for r in results), results


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_fsdp2_model_and_optimizer(agent, tmp_path, monkeypatch, device):
    """An nn.Module sharded by FSDP2's fully_shard (per layer and at the
    root), after one Adam step, its model and Adam state saved through
    the writer at world size 4 on the CPU (gloo; a forward and backward
    first where FSDP2 runs on the CPU, torch 2.14), or on the GPUs (NCCL,
    one rank a GPU, a forward and backward first): loaded back at that
    size on that device, then at two other world sizes on CPU ranks,
    every value equal to the full tensors saved."""
    torch = pytest.importorskip("torch")
    world = 4
    if device == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("no CUDA device")
        world = min(torch.cuda.device_count(), 4)
    monkeypatch.setenv("REWIND_DCP_MODEL", "fsdp2")
    job = f"dcp-fsdp2-{device}-{os.getpid()}"
    gang("save", world, agent, job, tmp_path, "7", device=device)
    results = gang("load", world, agent, job, tmp_path, device=device)
    check_loaded(results, world, saved_world=world)
    assert all(r["param_device"].startswith(device) for r in results), results
    assert set(results[0]["placements"].values()) == {"(Shard(dim=0),)"}, results[0]["placements"]
    for other in sorted({2, 3, world + 1} - {world})[:2]:
        check_loaded(gang("load", other, agent, job, tmp_path), other, saved_world=world)


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
    # The model's and the two Adam moments' bytes are stored once, not
    # once per rank: exactly, whatever else (pickled param_groups, whose
    # size varies with torch's version) is stored beside them.
    params = 4100 * 160 + 16 * 8 + 16 + 4 * 22 + 4
    groups = {"model": lambda f: f.startswith("model."), "exp_avg": lambda f: f.endswith(".exp_avg"),
              "exp_avg_sq": lambda f: f.endswith(".exp_avg_sq")}
    for what, member in groups.items():
        got = sum(n for fqn, n in nbytes.items() if member(fqn))
        assert got == params * 4, (what, got)


def test_async_save_then_load(agent, tmp_path):
    """dcp.async_save through the writer returns before the save is done;
    its future's completion leaves a checkpoint that loads."""
    job = f"dcp-async-{os.getpid()}"
    results = gang("async_save", 4, agent, job, tmp_path, "7")
    assert all(r["blocked_s"] <= r["save_s"] for r in results)
    check_loaded(gang("load", 3, agent, job, tmp_path), 3)


def _process_executor() -> bool:
    try:
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
    except ImportError:
        return False
    return hasattr(AsyncCheckpointerType, "PROCESS")


@pytest.mark.skipif(not _process_executor(), reason="this torch's async_save has no process executor (torch 2.7+)")
@pytest.mark.parametrize("stager", ["writer", "default"])
def test_async_save_in_dcps_checkpoint_process(agent, tmp_path, stager):
    """dcp.async_save with async_checkpointer_type=PROCESS sends the staged
    state and the writer to DCP's checkpoint process, which saves while
    the loop changes every tensor: staged by the writer (its copies go
    with the state dict, so the process writes the values at the call),
    and by DCP's DefaultStager (torchtitan's async_with_pinned_mem: the
    writer connects from that process). Loaded at 3, every value is the
    state at the call."""
    job = f"dcp-process-{stager}-{os.getpid()}"
    action = "async_save_process" + ("_stager" if stager == "default" else "")
    results = gang(action, 4, agent, job, tmp_path, "7")
    assert all(r["blocked_s"] <= r["save_s"] for r in results)
    check_loaded(gang("load", 3, agent, job, tmp_path), 3)


def _save_takes(param: str) -> bool:
    import inspect

    import torch.distributed.checkpoint as dcp
    return param in inspect.signature(dcp.save).parameters


@pytest.mark.skipif(not _save_takes("use_collectives"), reason="this torch's dcp.save has no use_collectives")
def test_save_without_collectives(agent, tmp_path):
    """dcp.save(..., use_collectives=False) plans every rank alone: each
    shard is still its rank's of the 4 (the rank DCP names), so the step
    is whole and loads at 3, every value equal."""
    job = f"dcp-no-collectives-{os.getpid()}"
    gang("save_alone", 4, agent, job, tmp_path, "7")
    check_loaded(gang("load", 3, agent, job, tmp_path), 3)


@pytest.mark.skipif(not _save_takes("no_dist"), reason="this torch's dcp.save has no no_dist")
def test_a_gang_saving_with_no_dist_is_refused_at_load(agent, tmp_path):
    """dcp.save(..., no_dist=True) in each of 4 processes, one after
    another: each saves the step as rank 0 of 1, its pieces alone, over the
    one before (FileSystemWriter's files would overwrite each other so).
    The load fails on every rank naming a tensor whose saved pieces do not
    cover it, rather than load the missing rows as what the target held."""
    job = f"dcp-nodist-{os.getpid()}"
    gang("save_no_dist", 4, agent, job, tmp_path, "7")
    for r in gang("load_refused", 4, agent, job, tmp_path):
        assert r["error"] and "saved pieces hold" in r["error"] and "not a whole checkpoint" in r["error"], r


def cluster(rewind_bin, start_agent, tmp_path, *coord_flags: str, agent_flags: tuple[str, ...] = ()):
    """A coordinator (with coord_flags) and two agents (with agent_flags),
    nodes a and b."""
    addr = f"127.0.0.1:{free_port()}"
    with open(tmp_path / "coordinator.log", "w") as log:
        coord = subprocess.Popen([rewind_bin, "coordinator", "--listen", addr, "--data", str(tmp_path / "coordinator"),
                                  "--metrics", "", "--gossip", "", *coord_flags], stdout=log, stderr=subprocess.STDOUT)
    try:
        yield [start_agent("--node", n, "--listen", f"127.0.0.1:{free_port()}", "--coordinator", addr, "--gossip", "",
                           *agent_flags) for n in ("a", "b")]
    finally:
        coord.kill()
        coord.wait()


@pytest.fixture
def two_nodes(rewind_bin, start_agent, tmp_path):
    """A coordinator and two agents, nodes a and b; the coordinator has
    each committed step's shards replicated to the other node."""
    yield from cluster(rewind_bin, start_agent, tmp_path)


@pytest.fixture
def two_nodes_unreplicated(rewind_bin, start_agent, tmp_path):
    """two_nodes with no replicas: each node holds its own ranks' shards."""
    yield from cluster(rewind_bin, start_agent, tmp_path, "--replicas", "0")


def save_on_two_nodes(a, b, job: str, out: Path) -> None:
    """dcp.save at world size 4, ranks 0-1 on a and 2-3 on b; returns once
    each node holds all four shards (its own and the other's replicas)."""
    gang("save", 4, [a, a, b, b], job, out, "7")
    for agent in (a, b):
        with rewind.Client(socket=agent.socket, job=job, rank=0, world_size=4) as c:
            deadline = time.monotonic() + 60
            while {s.rank for s in c.list() if s.step == 7 and s.state == rewind.ShardState.SHARD_STATE_COMMITTED} \
                    != {0, 1, 2, 3}:
                assert time.monotonic() < deadline, f"replicas never reached {agent.root}: {c.list()}"
                time.sleep(0.05)


def test_load_after_a_node_is_lost(two_nodes, tmp_path):
    """Node b dies with its shared memory and no spare node is left: the
    job loads at world size 2 on a alone, from a's own shards and the
    replicas of b's, every value equal to the full tensors."""
    a, b = two_nodes
    job = f"dcp-lost-{os.getpid()}"
    save_on_two_nodes(a, b, job, tmp_path)
    b.close()  # the node and its shared memory are gone
    assert not os.path.exists(b.root)
    with rewind.Client(socket=a.socket, job=job, rank=0, world_size=2) as c:
        assert c.latest_consistent() == 7
    check_loaded(gang("load", 2, a, job, tmp_path), 2)


def test_corrupt_piece_read_from_another_copy(two_nodes, tmp_path):
    """A flipped byte in b's copy of rank 2's shard: the rank reading it
    there finds the checksum wrong, the agent is told and drops that
    copy, and the piece is read from the other copy (a's replica,
    fetched back through the coordinator)."""
    a, b = two_nodes
    job = f"dcp-corrupt-{os.getpid()}"
    save_on_two_nodes(a, b, job, tmp_path)
    with rewind.Client(socket=b.socket, job=job, rank=2, world_size=4) as c:
        sh = next(s for s in c.list() if s.rank == 2 and s.step == 7)
    with open(sh.path, "r+b") as f:
        h = shard.decode_header(f.read())
        big = h.tensor("model.big.weight@2050,0")
        f.seek(h.data_start + big.begin + big.nbytes // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x40]))
    check_loaded(gang("load", 4, [a, a, b, b], job, tmp_path), 4)
    with rewind.Client(socket=b.socket, job=job, rank=2, world_size=4) as c:
        with c.open_shard(2, 7) as again:  # b serves a good copy now
            again.verify(t.name for t in again.header.tensors)


def assert_ranged(a, job: str, other: str) -> None:
    """a, having loaded step 7 at world size 2, holds only its own ranks'
    shards (0 and 1) and no partial file: what it read of ranks 2 and 3
    came in ranges from other, not as whole shards."""
    with rewind.Client(socket=a.socket, job=job, rank=0, world_size=2) as c:
        held = {s.rank for s in c.list() if s.step == 7}
    assert held == {0, 1}, f"a holds ranks {held} after the load: shards on {other} were pulled whole"
    partial = os.path.join(a.root, ".partial")
    assert not os.path.exists(partial) or os.listdir(partial) == []


def test_load_across_nodes_moves_only_the_ranges_read(two_nodes_unreplicated, tmp_path):
    """Saved at world size 4, ranks 0-1 on a and 2-3 on b, no replicas:
    loaded at world size 2 on a alone, every value equals the full
    tensors, and a holds no shard of ranks 2 and 3 afterwards (their
    headers and the ranges read were fetched into partial opens, not the
    shards whole) and no partial file."""
    a, b = two_nodes_unreplicated
    job = f"dcp-ranged-{os.getpid()}"
    gang("save", 4, [a, a, b, b], job, tmp_path, "7")
    with rewind.Client(socket=a.socket, job=job, rank=0, world_size=2) as c:
        deadline = time.monotonic() + 60
        while c.latest_consistent() != 7:
            assert time.monotonic() < deadline, "step 7 never became consistent"
            time.sleep(0.05)
    check_loaded(gang("load", 2, a, job, tmp_path), 2)
    assert_ranged(a, job, "b")


@pytest.fixture
def two_nodes_pfs(rewind_bin, start_agent, tmp_path):
    """two_nodes_unreplicated with a shared parallel filesystem tier that
    every step is copied to."""
    pfs = tmp_path / "pfs"
    for agents in cluster(rewind_bin, start_agent, tmp_path, "--replicas", "0", "--policy", "pfs:every=1,keep=2",
                          agent_flags=("--tier", f"pfs=file://{pfs}")):
        yield agents, pfs


def test_load_from_a_tier_after_a_node_is_lost(two_nodes_pfs, tmp_path):
    """Saved at world size 4, ranks 0-1 on a and 2-3 on b, no replicas,
    each step copied to the parallel filesystem; b dies with its memory.
    Loaded at world size 2 on a alone, every value equals the full
    tensors, and a holds no shard of ranks 2 and 3 afterwards: their
    headers and the ranges read came from the tier copy (checked against
    the leaf hashes stored beside it), not the shards whole."""
    (a, b), pfs = two_nodes_pfs
    job = f"dcp-tier-{os.getpid()}"
    gang("save", 4, [a, a, b, b], job, tmp_path, "7")
    step = pfs / job / f"step-{7:020d}"
    deadline = time.monotonic() + 60
    while not (step / "manifest.json").exists():
        assert time.monotonic() < deadline, f"step 7 never reached the tier: {list(pfs.rglob('*'))}"
        time.sleep(0.05)
    assert (step / f"rank-{2:06d}.leaves").exists()
    b.close()  # the node and its shared memory are gone
    check_loaded(gang("load", 2, a, job, tmp_path), 2)
    assert_ranged(a, job, "the tier")


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
